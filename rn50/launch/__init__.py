"""Launching and stopping: the project's Python for every entry point (interpreter), horovodrun under the
runner's supervision (supervisor).
"""
