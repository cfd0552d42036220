"""`bench --explain`: two results' receipts and numbers lined up, every difference named and ranked by what it can
explain. facts: a receipt as facts; flags: what each vLLM flag can do; sides: result files and published rows in;
lineup: the comparison and its text."""
