"""The build stage: recipe -> data -> teacher -> distill -> prune -> re-distill -> INT8 -> publish."""
