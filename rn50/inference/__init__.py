"""Forward only: validation, --mode val and pred, the network made ready for them with oneDNN fusion and
INT8 (inference), and --mode export to MXNet and ONNX (export), torchvision's names (torchvision_weights) and a
Triton model repository (triton).
"""
