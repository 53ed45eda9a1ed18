"""What every worker process stands on: the device it computes on (`device`), free
ports (`netutil`), its timed spans (`timeline`), its Prometheus series
(`worker_metrics`), the run directory's layout (`rundir`) and the registries that
extension points use (`registry`)."""
