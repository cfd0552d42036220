"""Getting bytes onto every node: Hugging Face's cache layout, the model's first copy (a node that holds it, a
download on the head, or this machine's cache), the pipelined node-to-node chain over the fabric and its progress
output, the `models.stage` step bootstrap runs, and the serving image's copy to the nodes that lack it.

It may import the engine; never nccl, serving, bench or the CLI.
"""
