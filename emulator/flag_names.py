"""Errors in the words of the command line.

The library names device options as :class:`chm.Config` spells them
(``create=1 creates it``, ``pass a smaller slot_size``); a user of
``chm-emu`` typed flags. :func:`in_flags` rewrites an error's text for one
command: each option the command has a flag for is named by that flag
(``--create``, ``--slot-size 8M``); options it has no flag for stay as they
are (they are set in the config file's ``[device]`` table).
"""

from __future__ import annotations

import re

import click

# A phrase that asks for a different value names the option right after it.
_ASKS = (
    r"(?:pass (?:a |an )?(?:smaller |larger |higher |lower )?"
    r"|or (?:a |an )?(?:smaller |larger )?|raise |lower )"
)


def _flags_of(command: click.Command) -> dict[str, tuple[str, bool]]:
    """Option name (as chm.Config spells it) -> (long flag, is a boolean flag)."""
    out: dict[str, tuple[str, bool]] = {}
    for p in command.params:
        if not isinstance(p, click.Option):
            continue
        longs = [o for o in p.opts if o.startswith("--")]
        if not longs:
            continue
        name = longs[0][2:].replace("-", "_")
        out[name] = (longs[0], bool(p.is_flag))
        if p.name and p.name != name:  # e.g. --target stored as targets
            out.setdefault(p.name, (longs[0], bool(p.is_flag)))
    return out


def in_flags(text: str, command: click.Command) -> str:
    """text with each device option that command has a flag for named by
    the flag: ``name=1`` of a boolean flag becomes the flag, ``name=VALUE``
    (or ``name="VALUE"``) becomes ``--name VALUE``, and a phrase asking for another value of an
    option (``pass a smaller wbuf``) names the flag."""
    flags = _flags_of(command)
    for name, (flag, is_flag) in sorted(flags.items(), key=lambda kv: -len(kv[0])):
        n = re.escape(name)
        if is_flag:
            text = re.sub(rf"(?<![\w-]){n}=(?:1|true|on|yes)\b", flag, text)
        text = re.sub(rf'(?<![\w-]){n}="([^"\s]*)"', rf"{flag} \1", text)
        text = re.sub(rf"(?<![\w-]){n}=(?=[^\s,;)]+)", f"{flag} ", text)
        text = re.sub(rf"\b({_ASKS}){n}\b", rf"\g<1>{flag}", text)
    if "config" in flags:  # the rest are set in the config file
        import chm

        names = {o.name for o in chm.options()} - set(flags)
        for name in sorted(names, key=len, reverse=True):
            text = re.sub(
                rf"\b({_ASKS}){re.escape(name)}\b(?! \()",
                rf"\g<1>{name} (in the [device] table of --config)",
                text,
            )
    return text


class FlagErrors(click.Group):
    """A group whose subcommands' errors name their flags (:func:`in_flags`):
    a ClickException's message is rewritten for the command that raised it,
    and a chm error that escapes a command becomes one."""

    def invoke(self, ctx: click.Context) -> object:
        from chm.errors import ChmError

        try:
            return super().invoke(ctx)
        except click.UsageError:
            raise  # click's own, about the flags already
        except click.ClickException as exc:
            sub = _subcommand(self, ctx)
            if sub is None:
                raise
            raise click.ClickException(in_flags(exc.format_message(), sub)) from exc
        except ChmError as exc:
            sub = _subcommand(self, ctx)
            text = str(exc) if sub is None else in_flags(str(exc), sub)
            raise click.ClickException(text) from exc


def _subcommand(group: click.Group, ctx: click.Context) -> click.Command | None:
    name = ctx.invoked_subcommand
    return group.get_command(ctx, name) if name else None
