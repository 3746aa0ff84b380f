{
  # ptspeed with Nix: `nix develop` gives the orchestration side (Python 3.11, Snakemake,
  # Apptainer, the report stack, the linters); `nix build` gives the ptspeed package itself.
  #
  # The benchmark environments are not Nix-built on purpose: "torch-2.0" must mean the same
  # wheels everywhere, and those are the hash-locked PyPI wheels of envs/torch-2.0.txt, which
  # docker/Dockerfile (podman, docker) and docker/ptspeed.def (Apptainer) install. nixpkgs'
  # torch is its own build, and a lock holds hashes without file names, so Nix cannot fetch its
  # wheels. flake.lock is not committed: it is written by the first `nix develop` (it needs
  # GitHub, which the machine this was written on cannot reach); commit it then.
  description = "ptspeed: reproducible PyTorch speed benchmarks";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.05";
    flake-utils.url = "github:numtide/flake-utils";
  };

  outputs = { self, nixpkgs, flake-utils }:
    flake-utils.lib.eachSystem [ "x86_64-linux" "aarch64-linux" ] (system:
      let
        pkgs = import nixpkgs { inherit system; };
        python = pkgs.python311;
        ptspeed = import ./nix/ptspeed.nix { inherit pkgs python; src = self; };
        pythonWithReportStack = python.withPackages (ps: [
          ps.pyyaml
          ps.jsonschema
          ps.pandas
          ps.seaborn
          ps.matplotlib
          ps.scipy
          ps.pytest
          ps.hypothesis
        ]);
      in
      {
        packages.default = ptspeed;
        packages.ptspeed = ptspeed;

        devShells.default = pkgs.mkShell {
          packages = [
            pythonWithReportStack
            pkgs.snakemake
            pkgs.snakefmt
            pkgs.apptainer
            pkgs.podman
            pkgs.ruff
            pkgs.hadolint
            pkgs.shellcheck
            pkgs.uv
            # torch 1.13 and 2.0 need Python 3.10 for their venvs (workflow/scripts/build_env.py).
            pkgs.python310
          ];
          shellHook = ''
            export PYTHONPATH="$PWD/src''${PYTHONPATH:+:$PYTHONPATH}"
          '';
        };
      });
}
