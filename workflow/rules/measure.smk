# Only the devices this run measures have measure jobs; any other device table is an input.
MEASURED = "|".join(MEASURED_DEVICES) or "(?!)"


rule measure:
    """Measure shard {shard} of the sampled archs on this machine (device {device})."""
    wildcard_constraints:
        device=MEASURED,
    input:
        code=code("measure"),
        params=lambda wc: [PARAMS["measure"], PARAMS[f"spaces.{wc.scale}"]],
        archs=rules.sample_archs.output[0],
        **DATA_INPUT,
    output:
        layout.shard("{scale}", "{device}", "{shard}", MEASURE_SHARDS),
    params:
        files=params_flags,
        vocab=vocab_flag,
        shards=MEASURE_SHARDS,
    threads: workflow.cores  # alone on the machine: concurrent jobs would distort timings
    resources:
        **measure_resources(),  # on a cluster: the node of cluster.devices[{device}]
    log:
        layout.log("{scale}", "measure-{device}-{shard}"),
    shell:
        "hwgptbench measure --scale {wildcards.scale:q} {params.files:q} {params.vocab:q}"
        " --archs {input.archs:q} --device {wildcards.device:q}"
        " --shard {wildcards.shard:q}/{params.shards:q} --out {output:q} 2>&1 | tee {log:q}"


rule measure_device:
    """The measurement table of one device, from its shards."""
    wildcard_constraints:
        device=MEASURED,
    input:
        shards=expand(rules.measure.output[0], shard=range(MEASURE_SHARDS), allow_missing=True),
        code=code("measure_device"),
    output:
        layout.device_table("{scale}", "{device}"),
    log:
        layout.log("{scale}", "measure_device-{device}"),
    shell:
        "hwgptbench merge-shards --out {output:q} {input.shards:q} 2>&1 | tee {log:q}"


rule measurements:
    """All device tables of a scale in one table: those this run measures, those published
    under devices/{scale}/ and any other present (pulled with DVC or copied into
    results/{scale}/measure/, which is made when this run measures nothing: a DVC output)."""
    input:
        tables=lambda wc: device_tables(wc.scale),
        code=code("measurements"),
    output:
        table=layout.measurements("{scale}"),
        metrics=layout.measure_metrics("{scale}"),
    params:
        measure_dir=lambda wc: layout.device_tables(wc.scale),
    log:
        layout.log("{scale}", "measurements"),
    shell:
        "mkdir -p {params.measure_dir:q} && hwgptbench merge-devices --out {output.table:q}"
        " --metrics-out {output.metrics:q} {input.tables:q} 2>&1 | tee {log:q}"
