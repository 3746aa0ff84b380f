# Benchmark cells: one job per (environment, model, variant, mode, size, trial). The harness
# writes exactly one record whatever happens (ok, unsupported, failed, oom, timeout,
# numerics_mismatch) and exits 0, so a bad cell never stops the run. Earlier trials have a
# higher priority: every cell's trial 0 runs before any trial 1, so baseline and candidate
# trials alternate in time and a drifting machine does not favour one side.


rule cell:
    input:
        env=env_ready_file,
        other_builds=other_builds,
        first_trial=first_trial_record,
    output:
        record=f"{RESULTS}/{RECORD_PATTERN}",
    log:
        f"{RESULTS}/logs/cells/{CELL_PATTERN}.log",
    benchmark:
        f"{RESULTS}/benchmarks/cells/{CELL_PATTERN}.tsv"
    priority: trial_priority
    container:
        env_container
    threads: cell_threads()
    resources:
        **CELL_JOB_RESOURCES,
        # A constant where it can be: Snakemake calls a function once per job.
        gpu=cell_gpus if DEVICE_CLASS == "cuda" else 0,
        runtime=runtime_minutes(config),
        mem_mb=config["mem_mb"],
        cpus_per_task=cell_cpus,
    params:
        python=env_python,
        arguments=cell_arguments,
        settings=cell_settings,
        pythonpath=CELL_PYTHONPATH,
    shell:
        "PYTHONPATH={params.pythonpath:q} {params.python} -m ptspeed cell {params.arguments}"
        " --out {output.record:q} > {log:q} 2>&1"
