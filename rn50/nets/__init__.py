"""What models.py's networks are made of: the record of a network's settings (network), the layers and the
layout/fusion Builder (layers) and the catalogue of architectures and depths (catalogue).
"""
