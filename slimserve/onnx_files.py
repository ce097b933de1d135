"""The files an ONNX graph is made of: the graph and the external data files its tensors point to."""

from __future__ import annotations

from pathlib import Path


def external_data_locations(onnx_path: Path) -> list[str]:
    """Relative paths of the external data files an ONNX graph refers to (sorted, unique)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    locations: set[str] = set()

    def visit_tensor(tensor) -> None:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)

    def visit_graph(graph) -> None:
        for tensor in graph.initializer:
            visit_tensor(tensor)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    visit_tensor(attribute.t)
                for tensor in attribute.tensors:
                    visit_tensor(tensor)
                if attribute.HasField("g"):
                    visit_graph(attribute.g)
                for subgraph in attribute.graphs:
                    visit_graph(subgraph)

    visit_graph(model.graph)
    return sorted(locations)


def onnx_model_files(onnx_path: Path) -> list[Path]:
    """The graph file, then its external data files (none, one ``.data`` file, or one per tensor).

    A graph alone in its directory has none: its file is not parsed (up to a second for a 200 MB graph).
    """
    onnx_path = Path(onnx_path)
    if onnx_path.is_file() and all(entry.name == onnx_path.name for entry in onnx_path.parent.iterdir()):
        return [onnx_path]
    return [onnx_path, *(onnx_path.parent / location for location in external_data_locations(onnx_path))]
