"""The flags resolved: train.py's Run group (run_flags), named recipes as data
(recipes), what val, pred and export take from the run that trained the weights (trained_settings), and the
one place that resolves them all, once (resolve). Their value types are rn50/flags.py's, below every folder.
"""
