"""Tools for development: the generators of the models shoal ships, tests and benches with
(``modelgen``: ONNX; ``torchgen``: TorchScript). Not part of the installed package."""
