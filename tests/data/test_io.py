"""Structure input: partially occupied (disordered) sites are refused, or with an
explicit opt-in taken as their majority species with a warning naming every site."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from alchemi_lit.core.errors import ConfigError, StructureError, StructureWarning
from alchemi_lit.data import SizeAwareSampler, read_structures

HEADER = """data_test
_symmetry_space_group_name_H-M   'F m -3 m'
_symmetry_Int_Tables_number      225
_cell_length_a                   3.80
_cell_length_b                   3.80
_cell_length_c                   3.80
_cell_angle_alpha                90
_cell_angle_beta                 90
_cell_angle_gamma                90
loop_
_atom_site_label
_atom_site_type_symbol
_atom_site_fract_x
_atom_site_fract_y
_atom_site_fract_z
_atom_site_occupancy
"""


def cif(path: Path, *sites: str) -> Path:
    """A cubic Fm-3m CIF with these ``label symbol x y z occupancy`` rows."""
    path.write_text(HEADER + "\n".join(sites) + "\n")
    return path


def test_a_disordered_site_is_refused_naming_the_site_and_the_fix(tmp_path: Path) -> None:
    """ASE reads Cu 0.5 / Au 0.5 as pure Au (``Au4``) and the run used to "converge"."""
    path = cif(tmp_path / "cuau.cif", "Cu1 Cu 0 0 0 0.5", "Au1 Au 0 0 0 0.5")
    message = (
        r"cuau\.cif' \(structure 0\) has partially occupied sites: site 0 \(Cu1, Cu 0\.5 \+ "
        r"Au 0\.5, 4 atoms\); ASE reads each as one species \(Au4\), another crystal: order "
        r"it first \(a supercell or SQS tool.*or pass partial_occupancy='majority'"
    )
    for read in (
        lambda: read_structures(path),
        lambda: read_structures(tmp_path),  # a folder: no hint about other files
        lambda: SizeAwareSampler(path, max_atoms=100),
    ):
        with pytest.raises(StructureError, match=message) as caught:
            read()
        assert "pattern such as" not in str(caught.value)


@pytest.mark.parametrize("occupancy", ["0.25", "0.95"])
def test_a_partly_empty_site_is_refused_too(tmp_path: Path, occupancy: str) -> None:
    path = cif(tmp_path / "vacancy.cif", "Cu1 Cu 0 0 0 1.0", f"O1 O 0.5 0.5 0.5 {occupancy}")
    with pytest.raises(StructureError, match=rf"site 1 \(O1, O {occupancy}, 4 atoms\)") as caught:
        read_structures(path)
    assert "site 0" not in str(caught.value)  # the ordered Cu site is fine


def test_majority_opt_in_takes_each_sites_majority_with_one_warning(tmp_path: Path) -> None:
    path = cif(
        tmp_path / "three.cif",
        "Cu1 Cu 0 0 0 0.75",
        "Au1 Au 0 0 0 0.25",
        "O1 O 0.5 0.5 0.5 0.6",
        "N1 N 0.5 0.5 0.5 0.4",
        "H1 H 0.25 0.25 0.25 1.0",
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        atoms = read_structures(path, partial_occupancy="majority")[0]
    said = [str(w.message) for w in record if issubclass(w.category, StructureWarning)]
    assert len(said) == 1, said
    assert "site 0 (Cu1, Cu 0.75 + Au 0.25, 4 atoms) as Cu" in said[0]
    assert "site 2 (O1, O 0.6 + N 0.4, 4 atoms) as O" in said[0]
    assert "H1" not in said[0]  # fully occupied: not named
    assert atoms.symbols.formula.count() == {"Cu": 4, "O": 4, "H": 8}


def test_a_tied_site_keeps_the_species_ase_read(tmp_path: Path) -> None:
    """Cu 0.5 / Au 0.5 has no majority: the species ASE's reader chose stays (the
    structure is then ASE's own reading), whichever order the CIF lists them in."""
    import ase.io

    for first, second in (("Cu", "Au"), ("Au", "Cu")):
        path = cif(
            tmp_path / f"{first}.cif",
            f"{first}1 {first} 0 0 0 0.5",
            f"{second}1 {second} 0 0 0 0.5",
        )
        with pytest.warns(StructureWarning, match="majority species"):
            (atoms,) = read_structures(path, partial_occupancy="majority")
        assert atoms.get_chemical_formula() == ase.io.read(path).get_chemical_formula()


def test_ordered_structures_read_silently_and_the_policy_is_checked(tmp_path: Path) -> None:
    path = cif(tmp_path / "cu.cif", "Cu1 Cu 0 0 0 1.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_structures(path)[0].get_chemical_formula() == "Cu4"
    with pytest.raises(ConfigError, match=r"partial_occupancy must be 'error' .* 'majority'"):
        read_structures(path, partial_occupancy="minority")  # type: ignore[arg-type]


def test_files_of_one_name_in_several_folders_keep_their_paths(tmp_path: Path) -> None:
    """Structures read by a pattern carry the path of their file, not its name: one
    POSCAR per folder is the usual layout, and results must map back to each."""
    from ase.build import bulk

    for k, folder in enumerate(("a", "b")):
        (tmp_path / folder).mkdir()
        bulk("Cu", "fcc", a=3.6 + 0.1 * k).write(tmp_path / folder / "POSCAR", format="vasp")
    read = read_structures(str(tmp_path / "*" / "POSCAR"))
    assert [a.info["source_file"] for a in read] == [
        str(tmp_path / "a" / "POSCAR"),
        str(tmp_path / "b" / "POSCAR"),
    ]
    assert read[1].cell[0, 1] == pytest.approx(3.7 / 2)
