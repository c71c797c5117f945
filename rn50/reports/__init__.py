"""What a run writes about itself: the human log, DLLogger lines and report.json (logs), TensorBoard events
(tensorboard_log) and MLPerf's result log (mlperf_log).
"""
