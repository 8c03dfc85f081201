"""What every view shares: the CSV's header line, number formats, and figures whose panels do
not overlap (constrained layout) under a title that names the device."""

import csv

CPU_NOTE = "CPU backend: no CUDA GPU found"
# The columns every row has, first in every CSV, so that any two runs compare by script.
LEADING_COLUMNS = ("op", "dtype", "tokens", "hidden", "impl", "time_us", "gbs", "pct_copy", "max_rel_err")
HEADER_PREFIX = "# llmk benchmark; "


def as_float(value):
    """A CSV cell as a float (None when empty)."""
    return float(value) if value not in (None, "") else None


def ms(row, key="time_us") -> str:
    """A row's time column in milliseconds ("-" when missing)."""
    t = as_float(row.get(key)) if row else None
    return f"{t / 1e3:.2f}" if t else "-"


def time_ratio(num, den, key="time_us"):
    """num's time over den's: den's speedup over num (None when either is missing)."""
    a, b = (as_float(r.get(key)) if r else None for r in (num, den))
    return a / b if a and b else None


def times(ratio) -> str:
    return f"{ratio:.2f}x" if ratio else "-"


def verdict(ok) -> str:
    """An aim met or not, as the tables print it."""
    return "yes" if ok else "**no**"


def header_line(commit, date, device) -> str:
    """The CSV's first line: '# llmk benchmark; commit C; DATE; DEVICE'."""
    return f"{HEADER_PREFIX}commit {commit}; {date}; {device}\n"


def parse_header(line):
    """(commit, date, device) of a header_line, or None for any other first line (experiments'
    CSVs describe themselves in free text)."""
    if not line.startswith(HEADER_PREFIX):
        return None
    parts = [s.strip() for s in line[len(HEADER_PREFIX):].split(";", 2)]
    if len(parts) != 3 or not parts[0].startswith("commit "):
        return None
    return parts[0].removeprefix("commit "), parts[1], parts[2]


def read_csv(path):
    """(first line, rows) of a CSV written by the runner; numeric cells stay strings."""
    with open(path, newline="") as f:
        first = f.readline()
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return first, rows


def columns(rows):
    """The CSV's columns: LEADING_COLUMNS, then the others in the order the rows first have them."""
    seen = dict.fromkeys(k for r in rows for k in r)
    return [c for c in LEADING_COLUMNS if c in seen] + [c for c in seen if c not in LEADING_COLUMNS]


def on_cpu(device: str) -> bool:
    return CPU_NOTE in device


def plot_title(device: str, what: str = "") -> str:
    """A figure's title: what it shows and the device it ran on, saying so when that is the CPU backend."""
    where = f"CPU backend, no GPU found: {device.split(' (' + CPU_NOTE)[0]}" if on_cpu(device) else device
    return f"llmk {what + ' ' if what else ''}on {where}"


def fmt(rate) -> str:
    """A rate in a table: whole numbers from 10 up, two significant digits below (CPU rows)."""
    if rate in (None, ""):
        return "-"
    rate = float(rate)
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


def sig(value: float) -> float:
    """A rate for the CSV: 0.1 resolution, three significant digits below 10 (CPU rows)."""
    return round(value, 1) if value >= 10 else float(f"{value:.3g}")


def figure(size, title):
    """A matplotlib figure of `size` inches with constrained layout (panels, labels and legends
    kept apart) and `title` above; headless (Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=size, layout="constrained")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def panels(rows, cols, size, title):
    """figure() with a rows x cols grid of axes (a 2-d array)."""
    fig = figure(size, title)
    return fig, fig.subplots(rows, cols, squeeze=False)
