"""Model FLOPs (`flops`), devices' peak FLOP/s (`peak_flops`) and MFU (`utilization`)."""
