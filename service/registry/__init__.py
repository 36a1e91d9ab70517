"""Model lines, their versions (ONNX classifiers) and aliases such as `production`."""
