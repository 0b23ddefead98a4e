"""`criu-gpushare doctor`: placeholder until the checks land (next commit)."""
import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json):
    """Check that this machine can checkpoint GPU processes, and say how to fix what fails."""
    raise click.ClickException("doctor: not written yet")
