# Environments: one virtualenv per environment, built from its hash-locked requirements and
# cached by the lock's hash (a rebuilt results/ reuses it; a changed lock builds a new one).
# An image a site brings (kind image) is not built: its record is read from inside it
# (rule brought_image).


rule build_env:
    input:
        requirements=lambda wildcards: ENVIRONMENTS[wildcards.env].requirements,
    output:
        ready=environment_record_path(RESULTS, "{env}"),
    log:
        f"{RESULTS}/logs/envs/{{env}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/envs/{{env}}.tsv"
    wildcard_constraints:
        env=BUILT_ENV_PATTERN,
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        python=HOST_PYTHON,
        python_version=lambda wildcards: ENVIRONMENTS[wildcards.env].python,
        dest=ENV_CACHE,
    shell:
        "{params.python} workflow/scripts/build_env.py --name {wildcards.env} --requirements {input.requirements:q}"
        " --python {params.python_version:q} --dest {params.dest:q} --link {output.ready:q}"
        " > {log:q} 2>&1"
