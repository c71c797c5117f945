"""The training step and what it computes: forward/backward/update and gradient accumulation (step), targets,
mixup, CutMix and loss scaling (losses), the weight average and what a run does with it (ema), distillation
(distill), the epoch's loss (epoch_loss), and what a run reached: its summary, wall time and target accuracy
(history).
"""
