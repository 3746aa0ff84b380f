# Aggregation: every record of the matrix into tidy tables (runs, steps, summary, speedups).
# What aggregate.py prints (a speedup not measured: a side without counted trials) reaches the
# console as well as its log.


rule effective_config:
    output:
        f"{RESULTS}/config.json",
    log:
        f"{RESULTS}/logs/effective_config.log",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        config=effective_config_json(config, DEVICE_CLASS, PLATFORM_PLAN.to_json()),
    shell:
        "printf '%s\\n' {params.config:q} > {output:q} 2> {log:q}"


rule aggregate:
    input:
        records=record_paths,
        config=rules.effective_config.output,
        claims="config/claims.yaml",
    output:
        runs=report(
            f"{RESULTS}/tables/runs.csv",
            caption="../../report/captions/runs.rst",
            category="Tables",
        ),
        summary=report(
            f"{RESULTS}/tables/summary.csv",
            caption="../../report/captions/summary.rst",
            category="Tables",
        ),
        speedups=report(
            f"{RESULTS}/tables/speedups.csv",
            caption="../../report/captions/speedups.rst",
            category="Tables",
        ),
        steps=report(
            f"{RESULTS}/tables/steps.csv",
            caption="../../report/captions/steps.rst",
            category="Tables",
        ),
    log:
        f"{RESULTS}/logs/aggregate.log",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        python=HOST_PYTHON,
        out_dir=lambda wildcards, output: Path(output.runs).parent,
    shell:
        "{params.python} workflow/scripts/aggregate.py --config {input.config:q} --claims {input.claims:q}"
        " --records {input.records:q} --out-dir {params.out_dir:q} 2>&1 | tee {log:q}"
