"""The training step and what it computes: forward/backward/update (step), targets, mixup, CutMix and loss
scaling (losses), the weight average (ema), distillation (distill), the extras' hooks (training_extras) and
the epoch's loss (epoch_loss).
"""
