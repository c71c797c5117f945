"""Optimisation: the learning rate schedule, all of it (schedule: its flags, defaults, checks, the scaling of a rate
with the batch, and the rate as a pure function of the position in training), LARS as MLPerf runs it (lars) and
LAMB as timm does (lamb), and the one map from --optimizer names to optimizer classes that builds the optimizer
from keyword values (factory, with the optimizer's flags).
"""
