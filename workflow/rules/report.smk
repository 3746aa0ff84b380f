# The report: the seed table reproduced, as a self-contained HTML page and as Markdown.


rule report:
    input:
        runs=rules.aggregate.output.runs,
        summary=rules.aggregate.output.summary,
        speedups=rules.aggregate.output.speedups,
        steps=rules.aggregate.output.steps,
        config=rules.effective_config.output,
        claims="config/claims.yaml",
        earlier=earlier_runs,
    output:
        html=report(
            f"{RESULTS}/report/index.html",
            caption="../../report/captions/report.rst",
            category="Report",
        ),
        markdown=f"{RESULTS}/report/report.md",
    log:
        f"{RESULTS}/logs/report.log",
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        python=HOST_PYTHON,
        out_dir=lambda wildcards, output: Path(output.html).parent,
        earlier=lambda wildcards, input: (
            f"--earlier {shlex.quote(input.earlier)}" if input.earlier else ""
        ),
    shell:
        "{params.python} workflow/scripts/render_report.py --runs {input.runs:q} --summary {input.summary:q}"
        " --speedups {input.speedups:q} --steps {input.steps:q} --config {input.config:q}"
        " --claims {input.claims:q} {params.earlier}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
