"""Optimisation: the learning rate as a pure function of the position in training (schedule), LARS as MLPerf
runs it (lars) and LAMB as timm does (lamb), and the one map from --optimizer names to optimizer classes that
builds the optimizer (factory).
"""
