"""Reading and validating what users hand to flipgate, one module for each thing read:
eval sets (`evalsets`), logits (`logits`) and ONNX models (`onnx_models`); `npy` reads the
.npy and .npz containers under the first two.

Nothing here unpickles: arrays are read with allow_pickle=False and ONNX files are parsed
as protobuf. Every refusal is an InputError with a machine-readable code.
"""
