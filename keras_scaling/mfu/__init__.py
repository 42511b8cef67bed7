"""Model FLOPs and MFU: how much of the devices' arithmetic the model uses.

- `flops`: the FLOPs of one training sample, counted from the traced graph;
- `peak_flops`: a replica's peak FLOPs per second, from a datasheet table or
  measured;
- `utilization`: model TFLOP/s and MFU from throughput, plain arithmetic;
- `_throughput_flops`: the figures `ThroughputLogger` writes, counted and
  looked up once per run.
"""
