"""The one rule that masks secrets wherever importwatch shows a command line or an environment.

A leaf every part shares (the traced process's banner, the watcher's and the tools' views of other
processes' command lines): the standard library only, and nothing imported at all.
"""

# -- secrets ------------------------------------------------------------------------------------
# A log is often read by others than the job's owner (attached to a ticket, left in a shared
# folder): the start line's argv, the env line, doctor's environment, inspect's and bisect's
# command lines, report's reading of old logs and the watcher's view of other processes' command
# lines all pass through these. It runs at start-up in the traced process: no `re`, no imports.
MASK = "***"

# Words that make a name secret wherever they appear in it (PGPASSWORD, --max-tokens: the safe side).
_ANYWHERE = ("TOKEN", "SECRET", "PASSWORD", "PASSWD")
# Cheap first test: a name that holds none of these is no secret (most are not).
_HINTS = ("TOKEN", "SECRET", "PASS", "AUTH", "CRED", "KEY")
# KEY only as a word of the name (--key, API_KEY) or the end of one of these (apikey): not --monkey.
_KEY_WORDS = ("KEY", "APIKEY", "ACCESSKEY", "PRIVATEKEY", "AUTHKEY", "SIGNINGKEY", "CLIENTKEY", "SSHKEY")
# A name whose last word says the value is a place (--keys-file, --password-file) names where a
# secret is kept, not the secret: it is shown.
_PLACES = ("FILE", "PATH", "DIR", "FOLDER")


def _words(upper: str) -> "list[str]":
    """The words of an upper-case name, split at every character that is not a letter or a digit."""
    words, word = [], ""
    for char in upper:
        if char.isalnum():
            word += char
        elif word:
            words.append(word)
            word = ""
    if word:
        words.append(word)
    return words


def is_secret(name: str) -> bool:
    """Whether NAME (a variable, an option, a NAME=value's name) says its value is a secret: it holds
    TOKEN, SECRET, PASSWORD or PASSWD anywhere, or a word PASS, AUTH, CRED..., KEY (see _KEY_WORDS),
    in any case; unless its last word is FILE, PATH, DIR or FOLDER."""
    upper = name.upper()
    # Spelled out, not any() over a generator: this runs for every argument at start-up.
    if not ("TOKEN" in upper or "SECRET" in upper or "PASS" in upper or "AUTH" in upper or "CRED" in upper
            or "KEY" in upper):  # fmt: skip
        return False
    words = _words(upper)
    if not words or words[-1] in _PLACES:
        return False
    for word in words:
        if "TOKEN" in word or "SECRET" in word or "PASSWORD" in word or "PASSWD" in word:
            return True
        if word == "PASS" or word.startswith(("PASSPHRASE", "PASSCODE", "PASSKEY")):
            return True
        if word == "AUTH" or word.startswith(("AUTHORIZ", "AUTHTOKEN")) or word.endswith("OAUTH"):
            return True
        if word.startswith("CRED") or word in _KEY_WORDS:
            return True
    return False


def mask_text(text: str) -> str:
    """TEXT with the password of each URL (`scheme://user:PASSWORD@host`) and each bearer token masked."""
    if "://" in text:
        text = _mask_urls(text)
    lower = text.lower()
    at = lower.find("bearer ")
    while at >= 0:
        begin = at + len("bearer ")
        while begin < len(text) and text[begin] == " ":
            begin += 1
        end = begin
        while end < len(text) and not text[end].isspace() and text[end] not in "'\",;":
            end += 1
        if end > begin and text[begin:end] != MASK:
            text = text[:begin] + MASK + text[end:]
            lower = text.lower()
        at = lower.find("bearer ", begin)
    return text


def _mask_urls(text: str) -> str:
    at = text.find("://")
    while at >= 0:
        begin = at + 3
        end = begin
        # The authority ends at the path, the query, a quote or a space (a URL inside -c code).
        while end < len(text) and text[end] not in "/?#'\" \t\n":
            end += 1
        authority = text[begin:end]
        userinfo, has_at, _ = authority.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if has_at and colon and password != MASK:
            text = text[:begin] + user + ":" + MASK + text[begin + len(userinfo) :]
            end = begin + len(user) + 1 + len(MASK)
        at = text.find("://", end)
    return text


def mask_argv(argv: "list[str]") -> "list[str]":
    """ARGV with secrets masked.

    `--password=xyz` and `db.api_key=xyz` (a NAME=value anywhere) keep their name;
    `--token X` and `-password X` mask the next argument, unless it is a long option itself;
    `-pVALUE` (a short -p with its value attached, as mysql takes a password) masks the value;
    a URL's password and a bearer token are masked in any argument.
    """
    masked: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not arg.startswith("--"):
                masked.append(MASK)
                continue
        name, equals, _ = arg.partition("=")
        if equals and is_secret(name):
            masked.append(name + equals + MASK)
            continue
        if arg.startswith("-") and len(arg) > 1:
            if is_secret(arg):  # -passwd X: the value comes next
                hide_next = True
            elif arg.startswith("-p") and len(arg) > 2 and arg[2] != "-":
                masked.append("-p" + MASK)
                continue
        masked.append(mask_text(arg))
    return masked


def mask_environment(variables: "dict[str, str]") -> "dict[str, str]":
    """VARIABLES with the value of each secret-looking name masked (and URLs' passwords in the rest),
    in the same order."""
    return {name: MASK if is_secret(name) else mask_text(value) for name, value in variables.items()}
