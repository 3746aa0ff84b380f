# The ptspeed package (src/ptspeed, its CLI `ptspeed`) built from the checkout; the harness side
# needs only pyyaml at run time, torch comes from the benchmark environment.
{ pkgs, python, src }:

python.pkgs.buildPythonPackage {
  pname = "ptspeed";
  version = "0.1.0";
  pyproject = true;
  inherit src;
  build-system = [ python.pkgs.setuptools ];
  dependencies = [ python.pkgs.pyyaml ];
  # The tests need torch and the workflow stack; they run with `make test`.
  doCheck = false;
  pythonImportsCheck = [ "ptspeed.cell.record" "ptspeed.envs.containers" ];
  meta = {
    description = "Reproducible PyTorch speed benchmarks: versions and optimisations, measured with intervals";
    platforms = pkgs.lib.platforms.linux;
  };
}
