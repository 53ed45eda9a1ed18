"""The workflow: TransferQueue tasks of an RL job, the driver and its modes."""
