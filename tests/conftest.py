"""Shared test set-up: the repository root on sys.path, and MXNet kept to the machine's cores."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault('OMP_NUM_THREADS', str(os.cpu_count() or 1))
