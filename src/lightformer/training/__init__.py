"""What a run uses beside the task: callbacks (atomic checkpoints, exact resume, non-finite stops,
throughput), progress, TensorBoard, FLOPs and device peaks, distribution (FSDP2), the Trainer class of
the command line, and the one place that touches other libraries' private internals."""
