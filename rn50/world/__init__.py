"""The worker world and its hardware: ranks, devices, precision and seeds (workers), this CPU as oneDNN and
OpenMP see it (cpu), and whether a batch fits the devices' memory (memory).
"""
