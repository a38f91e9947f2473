"""``keras-dl scaling RECIPE --setups 1,mirrored:2,np:-2``: one recipe trained on several
cluster setups with the same early-stopping thresholds, as child runs of one parent MLflow run,
and a page comparing their time to stop, final validation loss and throughput per replica."""
