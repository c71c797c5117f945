"""Launching and stopping: the project's Python for every entry point (interpreter), where the runner's workers
go (nodes: hosts, slots, workers per node, GPU ids), horovodrun under the runner's supervision (supervisor), and
a training worker's graceful stop on SIGTERM, SIGUSR1 or Ctrl-C (stop).
"""
