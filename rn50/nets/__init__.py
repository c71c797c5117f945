"""What models.py's networks are made of: the layers and the layout/fusion Builder (layers) and the catalogue
of architectures and depths (catalogue).
"""
