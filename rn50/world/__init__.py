"""The worker world and its hardware: who each worker is (workers: the Communicator of the collectives, which
holds the ranks, the World record, the seed), how the workers find each other and the check that they did
(rendezvous: the launchers, SLURM's tasks over Gloo), what each runs on (devices: the Devices record, the
contexts of each worker), AMP's precision (precision), this CPU as oneDNN and OpenMP see it (cpu), whether
a batch fits the devices' memory (memory), and the GPUs the CUDA driver shows, counted without MXNet (cuda_driver).
"""
