"""What runs unattended beside a serve: the supervisor on the head (observe -> judge -> act), its policy and its
incident history. serving/ installs it and reads what it tells; nothing here is imported by serving."""
