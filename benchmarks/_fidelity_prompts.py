"""The fixed prompt set and held-out texts of `benchmarks/fidelity.py` (built here, no downloads).

60 prompts in 7 categories (code, prose, dialogue, lists, numbers, multilingual,
structured) plus 4 long ones. The dialogue prompts are written in Gemma's chat
markup but tokenized as plain text (`parse_special=False`), so every model sees the
same characters and none of them its own control tokens.
"""

from __future__ import annotations

import importlib
import inspect
import random
from dataclasses import dataclass

__all__ = ["Prompt", "build_prompts", "heldout_texts"]

@dataclass(frozen=True, slots=True)
class Prompt:
    name: str
    category: str
    text: str


def _chat(*turns: str, system: str | None = None) -> str:
    """Gemma chat markup ending where the model's reply starts (system folded into the first turn)."""
    out = []
    for i, t in enumerate(turns):
        role = "user" if i % 2 == 0 else "model"
        if i == 0 and system:
            t = f"{system}\n\n{t}"
        out.append(f"<start_of_turn>{role}\n{t}<end_of_turn>\n")
    return "".join(out) + "<start_of_turn>model\n"


# fmt: off
_CODE = [
    ("py_fib", "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n    seq = [0, 1]\n    while len(seq) < n:\n        seq.append(seq[-1] + seq[-2])\n    return seq[:n]\n\n\ndef is_prime(n: int) -> bool:\n    if n < 2:\n        return False\n    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n"),
    ("py_class", "import dataclasses\nfrom typing import Optional\n\n\n@dataclasses.dataclass\nclass Account:\n    owner: str\n    balance: float = 0.0\n    currency: str = \"EUR\"\n\n    def deposit(self, amount: float) -> None:\n        if amount <= 0:\n            raise ValueError(\"amount must be positive\")\n        self.balance += amount\n\n    def withdraw(self, amount: float) -> Optional[float]:\n"),
    ("c_list", "#include <stdio.h>\n#include <stdlib.h>\n\nstruct node {\n    int value;\n    struct node *next;\n};\n\nstatic struct node *push(struct node *head, int value) {\n    struct node *n = malloc(sizeof *n);\n    if (!n) {\n        perror(\"malloc\");\n        exit(1);\n    }\n    n->value = value;\n    n->next = head;\n    return n;\n}\n\nstatic void free_list(struct node *head) {\n"),
    ("js_fetch", "async function loadUsers(apiBase) {\n  const response = await fetch(`${apiBase}/users?limit=50`);\n  if (!response.ok) {\n    throw new Error(`HTTP ${response.status}`);\n  }\n  const users = await response.json();\n  return users\n    .filter((u) => u.active)\n    .map((u) => ({ id: u.id, name: `${u.first} ${u.last}` }))\n"),
    ("sql", "-- monthly revenue per region, only completed orders\nSELECT r.name AS region,\n       date_trunc('month', o.created_at) AS month,\n       SUM(oi.quantity * oi.unit_price) AS revenue\nFROM orders o\nJOIN order_items oi ON oi.order_id = o.id\nJOIN customers c ON c.id = o.customer_id\nJOIN regions r ON r.id = c.region_id\nWHERE o.status = 'completed'\n"),
    ("bash", "#!/usr/bin/env bash\nset -euo pipefail\n\nBACKUP_DIR=\"/var/backups/$(date +%Y-%m-%d)\"\nmkdir -p \"$BACKUP_DIR\"\n\nfor db in $(psql -At -c \"select datname from pg_database where not datistemplate\"); do\n  echo \"dumping $db\"\n  pg_dump --format=custom \"$db\" > \"$BACKUP_DIR/$db.dump\"\ndone\n\n# keep the last seven days\n"),
    ("rust", "use std::collections::HashMap;\n\nfn word_counts(text: &str) -> HashMap<String, usize> {\n    let mut counts = HashMap::new();\n    for word in text.split_whitespace() {\n        let w = word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase();\n        if w.is_empty() {\n            continue;\n        }\n        *counts.entry(w).or_insert(0) += 1;\n    }\n    counts\n}\n\nfn main() {\n"),
    ("html", "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n  <meta charset=\"utf-8\">\n  <title>Quarterly report</title>\n  <link rel=\"stylesheet\" href=\"style.css\">\n</head>\n<body>\n  <header>\n    <h1>Quarterly report</h1>\n    <nav>\n      <ul>\n        <li><a href=\"#summary\">Summary</a></li>\n"),
]

_PROSE = [
    ("story", "The lighthouse keeper had not seen a ship in eleven days. Every evening he climbed the ninety-two steps, wiped the salt from the great lens, and lit the lamp as if the whole fleet were waiting just beyond the fog. On the twelfth evening, as the light swept across the water, he noticed"),
    ("science", "Photosynthesis converts light energy into chemical energy. In the light-dependent reactions, which take place in the thylakoid membranes, water molecules are split and oxygen is released as a by-product. The energy captured is stored in ATP and NADPH, which then power the Calvin cycle in the stroma, where carbon dioxide is"),
    ("history", "In 1848 a wave of revolutions spread across Europe. Beginning in Sicily in January and reaching Paris in February, the uprisings were driven by a mixture of economic hardship, demands for constitutional government and rising nationalism. Within months, rulers in Vienna, Berlin and several Italian states"),
    ("news", "City council approved a plan on Tuesday to convert three downtown parking garages into mixed-use buildings with affordable housing, retail space and a public library branch. The vote was seven to two. Supporters said the project would bring foot traffic back to the area, while opponents"),
    ("essay", "Good software documentation answers three questions before the reader has to ask them: what is this for, how do I start, and what do I do when it breaks. Most projects answer the second question well and neglect the other two, which is why"),
    ("recipe_prose", "To make a simple tomato sauce, warm three tablespoons of olive oil in a wide pan over medium heat. Add two sliced cloves of garlic and cook until they are fragrant but not brown. Pour in a can of crushed tomatoes, season with salt, and let the sauce simmer gently for"),
    ("philosophy", "Whether a ship that has had every plank replaced is still the same ship is an old puzzle, but it becomes practical when we ask the same question of a software system, an organisation or a person. Identity, in each case, seems to depend less on material than on"),
    ("legal", "1. Definitions. In this Agreement, \"Confidential Information\" means any information disclosed by either party to the other party, either directly or indirectly, in writing, orally or by inspection of tangible objects, which is designated as confidential or which reasonably should be understood to be confidential. 2. Obligations. The Receiving Party shall"),
]

_DIALOGUE = [
    ("chat_travel", _chat("I'm going to Lisbon for three days in May. What should I not miss?")),
    ("chat_code", _chat("Why does my Python loop `for i in range(len(xs)): xs.remove(xs[i])` crash with an IndexError?")),
    ("chat_multi", _chat(
        "Can you help me plan a small birthday party for my daughter? She turns seven.",
        "Of course! How many children are you expecting, and do you have a theme in mind?",
        "About twelve kids. She loves space and planets.",
    )),
    ("chat_system", _chat(
        "Summarise the following in one sentence: The meeting covered the budget for next year, "
        "the hiring plan for the support team, and the timeline for moving the office in September.",
        system="You are a concise assistant. Answer in plain English without lists.",
    )),
    ("chat_agent", _chat(
        "Task: review the pull request that adds retry logic to the HTTP client.",
        "I looked at the diff. The retry loop uses a fixed delay of one second and retries on every exception.",
        "What would you change before approving it?",
        system="You are the reviewer agent in a team of a planner, a coder and a reviewer.",
    )),
    ("chat_math", _chat("A train leaves at 14:35 and arrives at 18:10. How long is the journey, in minutes?")),
    ("script", "ALICE: Did you lock the back door?\nBOB: I thought you did.\nALICE: I asked you to, this morning, twice.\nBOB: Then it's probably locked.\nALICE: Probably.\nBOB: Fine. I'll go and check.\nALICE: Take the torch, the hallway light is out.\nBOB:"),
    ("interview", "Interviewer: What got you interested in marine biology?\nDr. Okafor: Honestly, a school trip to an aquarium when I was nine. I stood in front of the octopus tank for an hour.\nInterviewer: And what are you working on now?\nDr. Okafor:"),
]

_LISTS = [
    ("shopping", "Shopping list for the week:\n- 2 litres of milk\n- a dozen eggs\n- wholemeal bread\n- 500 g of pasta\n- tomatoes\n- cheddar cheese\n- apples\n-"),
    ("steps", "How to replace a bicycle inner tube:\n1. Shift to the smallest cog and open the brake.\n2. Remove the wheel from the frame.\n3. Use tyre levers to lift one side of the tyre off the rim.\n4. Pull out the old tube.\n5."),
    ("todo", "TODO (release 2.4)\n[x] bump version numbers\n[x] update the changelog\n[ ] regenerate the API docs\n[ ] run the integration suite on ARM\n[ ] tag the release\n[ ]"),
    ("agenda", "Agenda, product sync, Thursday 10:00\n* Welcome and introductions (5 min)\n* Metrics review: weekly active users, churn (10 min)\n* Roadmap: search improvements, billing migration (20 min)\n* Open questions\n*"),
    ("packing", "Packing list for a weekend hike:\n• rain jacket\n• two pairs of wool socks\n• head torch and spare batteries\n• map and compass\n• water filter\n• first-aid kit\n•"),
    ("pros_cons", "Working from home\nPros:\n- no commute\n- flexible hours\n- fewer interruptions\nCons:\n- less contact with colleagues\n- blurred line between work and home\n-"),
    ("bibliography", "References\n[1] Vaswani, A. et al. Attention Is All You Need. NeurIPS, 2017.\n[2] Dao, T. et al. FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness. NeurIPS, 2022.\n[3] Kwon, W. et al. Efficient Memory Management for Large Language Model Serving with PagedAttention. SOSP, 2023.\n[4]"),
    ("glossary", "Glossary\nLatency: the time between a request and its response.\nThroughput: the amount of work done per unit of time.\nCache hit: a request served from the cache.\nEviction: removing an entry to make room for another.\nWatermark:"),
]


def _numbers() -> list[tuple[str, str]]:
    rng = random.Random(20240611)
    csv_rows = ["date,station,temp_c,rain_mm"] + [
        f"2024-03-{d:02d},{rng.choice(['north', 'south', 'harbour'])},{rng.uniform(-2, 18):.1f},{rng.choice([0, 0, 0, 1.2, 3.5, 7.8])}"
        for d in range(1, 19)
    ]
    ledger = ["| item | qty | unit price | total |", "|---|---:|---:|---:|"]
    for item in ["bolts", "nuts", "washers", "brackets", "hinges", "screws"]:
        q, p = rng.randint(1, 400), rng.randint(5, 900) / 100
        ledger.append(f"| {item} | {q} | {p:.2f} | {q * p:.2f} |")
    arith = "\n".join(f"{a} + {b} = {a + b}" for a, b in ((rng.randint(10, 999), rng.randint(10, 999)) for _ in range(12)))
    primes = ", ".join(str(p) for p in [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53])
    log_lines = "\n".join(
        f"2024-05-0{1 + i // 6} {8 + i % 10:02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d} "
        f"{rng.choice(['INFO', 'INFO', 'WARN', 'ERROR'])} worker-{rng.randint(1, 4)} "
        f"{rng.choice(['job done in', 'retrying after', 'queue depth', 'latency ms'])} {rng.randint(1, 5000)}"
        for i in range(14)
    )
    return [
        ("csv", "\n".join(csv_rows) + "\n2024-03-19,"),
        ("ledger", "\n".join(ledger) + "\n| springs |"),
        ("arith", arith + f"\n{rng.randint(10, 999)} + {rng.randint(10, 999)} ="),
        ("primes", f"The first prime numbers are {primes}, "),
        ("timeseries", "Daily visitors: " + ", ".join(str(rng.randint(900, 1500)) for _ in range(40)) + ","),
        ("logs", log_lines + "\n2024-05-03 18:"),
        ("matrix", "A = [[" + "],\n     [".join(", ".join(f"{rng.uniform(-1, 1):.3f}" for _ in range(6)) for _ in range(6)) + "]]\ndet(A) ="),
        ("stats", "Sample of 25 measurements (mm): " + ", ".join(f"{rng.gauss(50, 4):.2f}" for _ in range(25))
         + ".\nThe mean of the sample is"),
    ]


_MULTI = [
    ("fr", "La ville s'éveillait lentement. Les boulangers avaient déjà sorti les premières fournées, et l'odeur du pain chaud se mêlait à celle de la pluie de la nuit. Sur la place du marché, les marchands installaient leurs étals de fruits, de fromages et de fleurs, pendant que"),
    ("de", "Die Energiewende stellt Deutschland vor große Herausforderungen. Der Ausbau von Wind- und Solarenergie muss beschleunigt werden, gleichzeitig fehlen Stromleitungen, die den Strom vom Norden in den Süden transportieren. Experten fordern deshalb"),
    ("es", "Querida Marta: te escribo desde Valparaíso, donde llevo ya dos semanas. Las casas de colores suben por los cerros y cada tarde el puerto se llena de gaviotas. Ayer tomé uno de los viejos ascensores y desde arriba pude ver"),
    ("zh", "人工智能正在改变我们的工作和生活方式。从智能手机上的语音助手到医院里的影像诊断系统，机器学习技术已经进入了许多领域。然而，随着这些技术的普及，人们也开始关注数据隐私和算法公平等问题。专家认为，"),
    ("ja", "東京の朝はとても忙しい。駅には通勤する人々があふれ、電車は数分おきに到着する。私は毎朝七時半に家を出て、駅の近くの小さな喫茶店でコーヒーを一杯飲む。その店の主人は"),
    ("ru", "Зима в этом году пришла рано. Уже в начале ноября выпал первый снег, и дети во дворе целыми днями лепили снеговиков и катались с горки. Бабушка говорила, что такой холодной осени не помнит с тех пор, как"),
    ("mixed_translate", "English: The library opens at nine and closes at six.\nFrench: La bibliothèque ouvre à neuf heures et ferme à dix-huit heures.\nEnglish: Please return the books before Friday.\nFrench: Veuillez rendre les livres avant vendredi.\nEnglish: Where is the nearest train station?\nFrench:"),
    ("pt_it_ko", "Português: Bom dia! Como você está?\nItaliano: Buongiorno! Come stai?\n한국어: 안녕하세요! 어떻게 지내세요?\nPortuguês: Obrigado pela ajuda.\nItaliano: Grazie per l'aiuto.\n한국어:"),
]

_STRUCTURED = [
    ("json", '{\n  "service": "checkout",\n  "version": "3.2.1",\n  "replicas": 4,\n  "env": {\n    "DATABASE_URL": "postgres://db:5432/shop",\n    "CACHE_TTL_SECONDS": 300,\n    "FEATURE_FLAGS": ["new_cart", "fast_pay"]\n  },\n  "resources": {\n    "cpu": "500m",\n'),
    ("yaml", "name: ci\non:\n  push:\n    branches: [main]\n  pull_request:\njobs:\n  test:\n    runs-on: ubuntu-latest\n    strategy:\n      matrix:\n        python: ['3.10', '3.11', '3.12']\n    steps:\n      - uses: actions/checkout@v4\n      - uses: actions/setup-python@v5\n        with:\n"),
    ("markdown", "# Installation\n\nagentmem needs Python 3.10 or newer.\n\n```bash\npip install agentmem\n```\n\n## Quick start\n\nCreate a pool and talk to two agents:\n\n```python\nfrom agentmem import MemoryPool\n\nwith MemoryPool(n_ctx=4096) as pool:\n"),
    ("traceback", "Traceback (most recent call last):\n  File \"/app/server.py\", line 88, in handle\n    result = process(request.json())\n  File \"/app/jobs.py\", line 41, in process\n    return totals[key] / counts[key]\nZeroDivisionError: division by zero\n\nThe error happens because"),
    ("regex_doc", "The pattern ^(?P<user>[\\w.+-]+)@(?P<domain>[\\w-]+\\.[\\w.-]+)$ matches an e-mail address. The first group captures"),
    ("email", "Subject: Re: delivery delayed\n\nHi Priya,\n\nThanks for letting us know. We understand that the parts for order #44871 are held at customs until Monday. Could you please confirm"),
    ("tool_call", _chat(
        "What's the weather in Oslo tomorrow?",
        '```tool_call\n{"name": "get_forecast", "arguments": {"city": "Oslo", "day": "tomorrow"}}\n```',
        'Tool result: {"city": "Oslo", "day": "tomorrow", "high_c": 7, "low_c": 1, "conditions": "light snow"}',
        system="You can call tools. To call one, answer with a tool_call block.",
    )),
    ("xml", "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<catalog>\n  <book id=\"bk101\">\n    <author>Gambardella, Matthew</author>\n    <title>XML Developer's Guide</title>\n    <genre>Computer</genre>\n    <price>44.95</price>\n  </book>\n  <book id=\"bk102\">\n"),
]


# fmt: on


def _long_prompts() -> list[tuple[str, str, str]]:
    """Longer contexts (300-900 tokens), where quantization error accumulates over more cells."""
    prose = " ".join(t for _, t in _PROSE[:5])
    code = "\n\n".join(t for _, t in _CODE[:4])
    chat = _chat(
        "I maintain a small open-source library and want to add a plugin system. Where do I start?",
        "Start by deciding what a plugin may change: new commands, new output formats, or hooks into "
        "existing steps. Then define one small interface per extension point, load plugins through "
        "entry points, and keep a registry that lists what was found.",
        "How should I version the plugin interface so that old plugins keep working?",
        "Give the interface its own version number, separate from the library's. Add methods only with "
        "defaults, deprecate before removing, and let each plugin declare the interface version it was "
        "written for, so the loader can warn or refuse clearly instead of failing later.",
        "And how do I test plugins that I did not write?",
        system="You are a senior software engineer who explains trade-offs clearly.",
    )
    multi = "\n".join(t for _, t in _MULTI[:6])
    return [("long_prose", "prose", prose), ("long_code", "code", code), ("long_chat", "dialogue", chat),
            ("long_multilingual", "multilingual", multi)]


def build_prompts() -> list[Prompt]:
    """The fixed prompt set: 8 per category in 7 categories, plus 4 long ones (60)."""
    out: list[Prompt] = []
    for cat, items in (("code", _CODE), ("prose", _PROSE), ("dialogue", _DIALOGUE), ("lists", _LISTS),
                       ("numbers", _numbers()), ("multilingual", _MULTI), ("structured", _STRUCTURED)):
        out += [Prompt(name, cat, text) for name, text in items]
    out += [Prompt(name, cat, text) for name, cat, text in _long_prompts()]
    names = [p.name for p in out]
    assert len(set(names)) == len(names), f"duplicate prompt names: {names}"
    return out


def heldout_texts() -> dict[str, str]:
    """Held-out text for perplexity (not in the prompt set): stdlib prose and stdlib code."""
    docs = []
    names = ["argparse", "json", "logging", "csv", "heapq", "shutil", "sqlite3", "textwrap", "fractions", "decimal"]
    for name in names:
        mod = importlib.import_module(name)
        docs.append(mod.__doc__ or "")
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr, None)
            if callable(obj) and obj.__doc__ and not attr.startswith("_"):
                docs.append(obj.__doc__)
    code = inspect.getsource(importlib.import_module("textwrap")) + inspect.getsource(importlib.import_module("heapq"))
    return {"stdlib_docs": "\n\n".join(docs), "stdlib_code": code}
