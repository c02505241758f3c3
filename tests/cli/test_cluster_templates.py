"""The sbatch templates of ``configs/slurm/`` and the cluster guide stay runnable: every
script is valid bash, every ``alchemi-lit run`` line in them validates with its own
arguments (SLURM variables filled in), and the guide's code blocks parse."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from alchemi_lit.cli import main

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((ROOT / "configs" / "slurm").glob("*.sbatch"))
GUIDE = ROOT / "docs" / "how-to" / "cluster.md"
SLURM = {"SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_ARRAY_TASK_ID": "0",
         "SLURM_ARRAY_TASK_COUNT": "16", "DEVICES": "8"}  # fmt: skip


def run_lines(text: str) -> list[list[str]]:
    """The ``alchemi-lit run`` commands of a script (continuation lines joined, srun
    dropped, shell variables filled in)."""
    text = text.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = re.sub(r"^\s*srun\s+", "", line.strip())
        if line.startswith("alchemi-lit run "):
            for var, value in SLURM.items():
                line = line.replace(f"${{{var}}}", value).replace(f"${var}", value)
            commands.append(shlex.split(line)[2:])
    return commands


def test_there_are_templates_for_one_node_several_nodes_and_an_array():
    assert {p.stem for p in TEMPLATES} == {"one_node", "multi_node", "array"}


@pytest.mark.parametrize("template", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_template_is_valid_bash_and_its_runs_validate(template, tmp_path, monkeypatch, capsys):
    check = subprocess.run(["bash", "-n", str(template)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    text = template.read_text()
    assert "--ntasks-per-node" in text and "--ntasks=" not in text  # (Fabric needs it)
    commands = run_lines(text)
    assert commands, "no alchemi-lit run line"
    for args in commands:
        if "campaign.yaml" in args:  # the user's own config (the array template)
            assert "--shard" in args
            continue
        config = ROOT / args[args.index("--config") + 1]
        assert config.exists(), config
        args[args.index("--config") + 1] = str(config)
        monkeypatch.chdir(tmp_path)
        assert main(["validate", *args]) == 0, capsys.readouterr().err
        devices = int(args[args.index("--simulator.devices") + 1])
        nodes = int(re.search(r"--nodes=(\d+)", text).group(1))
        per_node = int(re.search(r"--ntasks-per-node=(\d+)", text).group(1))
        assert devices == nodes * per_node, "one srun task per rank"


def test_the_guide_code_blocks_parse(tmp_path):
    blocks = re.findall(r"```(\w+)\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert {lang for lang, _ in blocks} == {"bash", "python"}
    for lang, code in blocks:
        if lang == "bash":
            script = tmp_path / "block.sh"
            script.write_text(code)
            check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            assert check.returncode == 0, f"{check.stderr}\n{code}"
        else:
            compile(code, "cluster.md", "exec")
