"""The flags' values: their types and ranges (flags), named recipes as data (recipes), and what val, pred,
export and a continued run take from the run that trained the weights (trained_settings).
"""
