"""Launching and stopping: the project's Python for every entry point (interpreter), horovodrun under the
runner's supervision (supervisor), and a training worker's graceful stop on SIGTERM, SIGUSR1 or Ctrl-C (stop).
"""
