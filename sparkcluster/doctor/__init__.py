"""`sparkcluster doctor`: every check that needs no serving, nodes compared with each other, and the support
bundle. It reads what node/ knows of a Spark, and where nccl/ and serving/ leave their records."""
