"""Optimisation: the learning rate as a pure function of the position in training (schedule), LARS as MLPerf
runs it (lars) and LAMB as timm does (lamb).
"""
