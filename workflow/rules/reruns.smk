# Reruns of perturbed trials (config conditions.reruns). Once every trial of a round has run,
# judge_trials lists the round's perturbed trials; each runs again as a new record (trial number
# + trials) in the next round, baseline and candidate alternating by priority as in the first,
# but for a rerun every rule of which flagged the trial it repeats too (the rule, not the
# machine). A round is judged against the rounds up to it, here and in the tables alike, so
# the tables count exactly what the reruns left. The aggregate rule asks for every round's
# reruns (record_paths).


checkpoint judge_trials:
    input:
        records=judged_records,
        config=rules.effective_config.output,
    output:
        f"{RESULTS}/reruns/round{{attempt}}.json",
    log:
        f"{RESULTS}/logs/reruns/round{{attempt}}.log",
    wildcard_constraints:
        attempt=NUMBER,
    localrule: True
    conda:
        "../../envs/workflow.yaml"
    params:
        python=HOST_PYTHON,
    shell:
        "{params.python} workflow/scripts/judge_trials.py --config {input.config:q}"
        " --attempt {wildcards.attempt} --records {input.records:q} --out {output:q}"
        " > {log:q} 2>&1"
