"""What the allocation bench programs print and the comparison scripts
read: the truth per site ("TRUTH site=NAME key=N ..." lines, from
alloc_sites and peak_sites) and a profiler's figures summed per site."""
import re
import sys


def parse_truth(stdout, sites, program):
    """{site: {key: int}} from the TRUTH lines; exits when a site has none."""
    truth = {}
    for line in stdout.splitlines():
        if line.startswith("TRUTH "):
            fields = dict(f.split("=", 1) for f in line.split()[1:])
            truth[fields["site"]] = {k: int(v) for k, v in fields.items() if k != "site"}
    if set(truth) != set(sites):
        sys.exit(f"{program} printed no truth for every site:\n{stdout}")
    return truth


def per_site(lines, sites, value_of):
    """Sums value_of(line) over the lines naming each site."""
    sums = {s: 0.0 for s in sites}
    for line in lines:
        for s in sites:
            if re.search(r"\b" + s + r"\b", line):
                v = value_of(line)
                if v is not None:
                    sums[s] += v
    return sums
