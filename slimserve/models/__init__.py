"""Models: the torch scorer graphs, the teacher loader and the one padded-batching function.

``compression`` and ``export`` both sit on this package and never import each other. ``batching``
needs only numpy (the scoring service calls it); the graph modules import torch.
"""
