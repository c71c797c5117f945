"""Forward only: validation, --mode val and the network made ready for val and pred with oneDNN fusion and INT8
(evaluation; int8), --mode pred (prediction), and --mode export to MXNet and ONNX (export), torchvision's names
(torchvision_weights) and a Triton model repository (triton).
"""
