# Benchmark cells: one job per (environment, model, variant, mode, size, trial). The harness
# writes exactly one record whatever happens (ok, unsupported, failed, oom, timeout,
# numerics_mismatch) and exits 0, so a bad cell never stops the run. Earlier trials have a
# higher priority: every cell's trial 0 runs before any trial 1, so baseline and candidate
# trials alternate in time and a drifting machine does not favour one side. On a cluster each
# trial of a (platform, model, mode, size) is one group job: its sides back to back on one node,
# in alternating order (side_before), so that node-to-node differences stay out of a speedup.


rule cell:
    input:
        env=env_ready_file,
        other_builds=other_builds,
        first_trial=first_trial_record,
        side_before=side_before,
    output:
        record=f"{RESULTS}/{RECORD_PATTERN}",
    log:
        f"{RESULTS}/logs/cells/{CELL_PATTERN}.log",
    benchmark:
        f"{RESULTS}/benchmarks/cells/{CELL_PATTERN}.tsv"
    priority: trial_priority
    group:
        trial_group
    container:
        env_container
    threads: cell_threads
    resources:
        **CELL_JOB_RESOURCES,
        runtime=runtime_minutes(SETTINGS),
        mem_mb=SETTINGS.mem_mb,
        cpus_per_task=cell_cpus,
    params:
        python=env_python,
        arguments=cell_arguments,
        settings=cell_settings,
        pythonpath=CELL_PYTHONPATH,
    shell:
        "PYTHONPATH={params.pythonpath:q} {params.python} -m ptspeed cell {params.arguments}"
        " --out {output.record:q} > {log:q} 2>&1"
