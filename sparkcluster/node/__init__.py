"""What a DGX Spark node is and needs: the QSFP port and the comm env bound to it (`network`), the fabric
address plan (`addressing`), and the bootstrap steps that provision a node (`steps`: preflight, fabric
addresses, the ssh key mesh, the comm env file, the HF cache). Its steps register by name like any other."""
