"""Ticket data for build_bundle.py: the bugs, their reports, and the held-out evaluation records."""

from __future__ import annotations

from typing import Any

# Each ticket: issue metadata, the fix as (path, fixed text, buggy text) edits, and the added tests as
# (path,) for a new file or (path, first line of the first added test) for tests appended to a file.
TICKETS: list[dict[str, Any]] = [
    # ----------------------------------------------------------------------------------- ledgerlite
    {
        "number": 3,
        "repo": "ledgerlite",
        "title": "to_money() rounds half-cents to even (0.125 -> 0.12)",
        "user": "mfernandez-dev",
        "labels": ["bug", "money"],
        "created_at": "2024-02-06T09:14:51Z",
        "closed_at": "2024-02-08T17:42:03Z",
        "pull_request": 4,
        "merged_at": "2024-02-08T17:42:00Z",
        "changes": [
            (
                "ledgerlite/money.py",
                "from decimal import ROUND_HALF_UP, Decimal, InvalidOperation\n",
                "from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation\n",
            ),
            (
                "ledgerlite/money.py",
                "    return amount.quantize(CENT, rounding=ROUND_HALF_UP)\n",
                "    return amount.quantize(CENT, rounding=ROUND_HALF_EVEN)\n",
            ),
        ],
        "tests": [("tests/test_issue_3.py",)],
    },
    {
        "number": 6,
        "repo": "ledgerlite",
        "title": "Balance of Assets:Card includes Assets:Cardholder accounts",
        "user": "okonkwo-ada",
        "labels": ["bug", "accounts"],
        "created_at": "2024-02-19T20:03:12Z",
        "closed_at": "2024-02-23T11:26:40Z",
        "pull_request": 7,
        "merged_at": "2024-02-23T11:26:37Z",
        "changes": [
            (
                "ledgerlite/accounts.py",
                "        prefix = name + SEPARATOR\n"
                "        return [account for account in self"
                " if account.name == name or account.name.startswith(prefix)]\n",
                "        return [account for account in self if account.name.startswith(name)]\n",
            ),
        ],
        "tests": [("tests/test_issue_6.py",)],
    },
    {
        "number": 9,
        "repo": "ledgerlite",
        "title": "balance(as_of=...) leaves out transactions dated on the as_of day",
        "user": "jpl-books",
        "labels": ["bug"],
        "created_at": "2024-03-04T13:37:29Z",
        "closed_at": "2024-03-05T08:02:15Z",
        "pull_request": 10,
        "merged_at": "2024-03-05T08:02:12Z",
        "changes": [
            (
                "ledgerlite/ledger.py",
                "            if as_of is not None and txn.date > as_of:\n"
                "                break\n"
                "            total += txn.amount_for(names)\n",
                "            if as_of is not None and txn.date >= as_of:\n"
                "                break\n"
                "            total += txn.amount_for(names)\n",
            ),
        ],
        "tests": [
            (
                "tests/test_ledger.py",
                "def test_balance_as_of_includes_transactions_on_that_day(ledger: Ledger) -> None:",
            )
        ],
    },
    {
        "number": 11,
        "repo": "ledgerlite",
        "title": "load_csv fails with 'missing columns: date' on CSV saved by Excel",
        "user": "lindqvist-m",
        "labels": ["bug", "csv", "unicode"],
        "created_at": "2024-03-18T07:55:02Z",
        "closed_at": "2024-03-21T15:10:48Z",
        "pull_request": 13,
        "merged_at": "2024-03-21T15:10:45Z",
        "changes": [
            (
                "ledgerlite/csvio.py",
                '    with open(path, newline="", encoding="utf-8-sig") as stream:\n',
                '    with open(path, newline="", encoding="utf-8") as stream:\n',
            ),
        ],
        "tests": [("tests/test_issue_11.py",)],
    },
    {
        "number": 14,
        "repo": "ledgerlite",
        "title": "Ledger.transfer moves money in the wrong direction",
        "user": "priya-raman",
        "labels": ["bug"],
        "created_at": "2024-04-02T18:21:33Z",
        "closed_at": "2024-04-03T09:47:19Z",
        "pull_request": 16,
        "merged_at": "2024-04-03T09:47:16Z",
        "changes": [
            (
                "ledgerlite/ledger.py",
                "        return self.post(Transaction.simple(date, description, destination, source, amount))\n",
                "        return self.post(Transaction.simple(date, description, source, destination, amount))\n",
            ),
        ],
        "tests": [("tests/test_issue_14.py",)],
    },
    {
        "number": 17,
        "repo": "ledgerlite",
        "title": "month_periods / period_totals crash for ranges that include December",
        "user": "delacroix-tb",
        "labels": ["bug", "reports"],
        "created_at": "2024-12-30T10:08:44Z",
        "closed_at": "2025-01-02T14:31:57Z",
        "pull_request": 18,
        "merged_at": "2025-01-02T14:31:54Z",
        "changes": [
            (
                "ledgerlite/reports.py",
                "        if first.month == 12:\n"
                "            first = first.replace(year=first.year + 1, month=1)\n"
                "        else:\n"
                "            first = first.replace(month=first.month + 1)\n",
                "        first = first.replace(month=first.month + 1)\n",
            ),
        ],
        "tests": [("tests/test_issue_17.py",)],
    },
    # -------------------------------------------------------------------------------------- textkit
    {
        "number": 21,
        "repo": "textkit",
        "title": "slugify drops accented letters instead of transliterating them",
        "user": "sol-ortega",
        "labels": ["bug", "unicode"],
        "created_at": "2024-05-07T11:02:18Z",
        "closed_at": "2024-05-09T16:45:30Z",
        "pull_request": 22,
        "merged_at": "2024-05-09T16:45:27Z",
        "changes": [
            ("textkit/slug.py", "import re\nimport unicodedata\n", "import re\n"),
            (
                "textkit/slug.py",
                '    decomposed = unicodedata.normalize("NFKD", text)\n'
                '    ascii_text = decomposed.encode("ascii", "ignore").decode("ascii").lower()\n',
                '    ascii_text = text.encode("ascii", "ignore").decode("ascii").lower()\n',
            ),
        ],
        "tests": [("tests/test_issue_21.py",)],
    },
    {
        "number": 24,
        "repo": "textkit",
        "title": "wrap() breaks a line early when the words fit exactly",
        "user": "tomasz-k",
        "labels": ["bug"],
        "created_at": "2024-05-20T08:31:09Z",
        "closed_at": "2024-05-22T19:12:41Z",
        "pull_request": 25,
        "merged_at": "2024-05-22T19:12:38Z",
        "changes": [
            (
                "textkit/wrap.py",
                "        elif len(current) + 1 + len(word) <= width:\n",
                "        elif len(current) + 1 + len(word) < width:\n",
            ),
        ],
        "tests": [("tests/test_wrap.py", "def test_wrap_fills_lines_up_to_exactly_width() -> None:")],
    },
    {
        "number": 27,
        "repo": "textkit",
        "title": "ngrams() is missing the last n-gram",
        "user": "yuki-tanabe",
        "labels": ["bug"],
        "created_at": "2024-06-11T03:48:27Z",
        "closed_at": "2024-06-11T21:05:13Z",
        "pull_request": 28,
        "merged_at": "2024-06-11T21:05:10Z",
        "changes": [
            (
                "textkit/tokens.py",
                "    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]\n",
                "    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n)]\n",
            ),
        ],
        "tests": [("tests/test_issue_27.py",)],
    },
    {
        "number": 29,
        "repo": "textkit",
        "title": "similarity('', '') raises ZeroDivisionError",
        "user": "adeyemi-f",
        "labels": ["bug"],
        "created_at": "2024-06-25T14:17:55Z",
        "closed_at": "2024-06-27T10:40:02Z",
        "pull_request": 30,
        "merged_at": "2024-06-27T10:39:59Z",
        "changes": [
            (
                "textkit/distance.py",
                "    longest = max(len(a), len(b))\n    if longest == 0:\n        return 1.0\n",
                "    longest = max(len(a), len(b))\n",
            ),
        ],
        "tests": [("tests/test_issue_29.py",)],
    },
    {
        "number": 33,
        "repo": "textkit",
        "title": "truncate() returns strings longer than `length` with a custom ellipsis",
        "user": "clairebvn",
        "labels": ["bug"],
        "created_at": "2024-07-15T16:22:40Z",
        "closed_at": "2024-07-19T12:03:26Z",
        "pull_request": 34,
        "merged_at": "2024-07-19T12:03:23Z",
        "changes": [
            (
                "textkit/truncate.py",
                "    return text[: length - len(ellipsis)].rstrip() + ellipsis\n",
                "    return text[: length - 1].rstrip() + ellipsis\n",
            ),
        ],
        "tests": [("tests/test_issue_33.py",)],
    },
    {
        "number": 36,
        "repo": "textkit",
        "title": "closest() is case-sensitive by default, and case_sensitive=True does the opposite",
        "user": "kwame-osei",
        "labels": ["bug"],
        "created_at": "2024-08-05T09:09:09Z",
        "closed_at": "2024-08-06T13:55:48Z",
        "pull_request": 37,
        "merged_at": "2024-08-06T13:55:45Z",
        "changes": [
            (
                "textkit/distance.py",
                "    if not case_sensitive:\n        return value.casefold()\n",
                "    if case_sensitive:\n        return value.casefold()\n",
            ),
        ],
        "tests": [("tests/test_issue_36.py",)],
    },
    # ------------------------------------------------------------------------------------ schedwise
    {
        "number": 52,
        "repo": "schedwise",
        "title": "Back-to-back meetings reported as conflicts",
        "user": "marta-sz",
        "labels": ["bug", "agenda"],
        "created_at": "2024-09-03T07:40:11Z",
        "closed_at": "2024-09-04T15:20:36Z",
        "pull_request": 53,
        "merged_at": "2024-09-04T15:20:33Z",
        "changes": [
            (
                "schedwise/interval.py",
                "        return self.start < other.end and other.start < self.end\n",
                "        return self.start <= other.end and other.start <= self.end\n",
            ),
        ],
        "tests": [("tests/test_issue_52.py",)],
    },
    {
        "number": 55,
        "repo": "schedwise",
        "title": "Monthly recurrence starting on the 31st raises ValueError",
        "user": "rgupta42",
        "labels": ["bug", "recurrence"],
        "created_at": "2024-10-01T12:12:58Z",
        "closed_at": "2024-10-04T09:33:21Z",
        "pull_request": 56,
        "merged_at": "2024-10-04T09:33:18Z",
        "changes": [
            (
                "schedwise/recurrence.py",
                "    day = min(moment.day, calendar.monthrange(year, month)[1])\n"
                "    return moment.replace(year=year, month=month, day=day)\n",
                "    return moment.replace(year=year, month=month)\n",
            ),
            ("schedwise/recurrence.py", "import calendar\nimport datetime as dt\n", "import datetime as dt\n"),
        ],
        "tests": [("tests/test_issue_55.py",)],
    },
    {
        "number": 57,
        "repo": "schedwise",
        "title": "workdays_between is one short when a holiday falls on a weekend",
        "user": "emeka-n",
        "labels": ["bug", "workdays"],
        "created_at": "2024-12-27T10:51:30Z",
        "closed_at": "2025-01-06T08:18:07Z",
        "pull_request": 58,
        "merged_at": "2025-01-06T08:18:04Z",
        "changes": [
            (
                "schedwise/workdays.py",
                "        count -= sum(1 for day in self.holidays"
                " if start <= day < end and day.weekday() not in self.weekend)\n",
                "        count -= sum(1 for day in self.holidays if start <= day < end)\n",
            ),
        ],
        "tests": [("tests/test_issue_57.py",)],
    },
    {
        "number": 60,
        "repo": "schedwise",
        "title": "Holidays added to one WorkCalendar show up in every other WorkCalendar",
        "user": "ivan-petrov-dev",
        "labels": ["bug", "workdays"],
        "created_at": "2025-01-14T15:29:46Z",
        "closed_at": "2025-01-15T10:02:54Z",
        "pull_request": 61,
        "merged_at": "2025-01-15T10:02:51Z",
        "changes": [
            (
                "schedwise/workdays.py",
                "    def __init__(self, holidays: Iterable[dt.date] = (), weekend: Iterable[int] = WEEKEND) -> None:\n"
                "        self.holidays: set[dt.date] = set(holidays)\n",
                "    def __init__(self, holidays: list[dt.date] = [], weekend: Iterable[int] = WEEKEND) -> None:\n"
                "        self.holidays = holidays\n",
            ),
            ("schedwise/workdays.py", "        self.holidays.add(day)\n", "        self.holidays.append(day)\n"),
        ],
        "tests": [("tests/test_issue_60.py",)],
    },
    {
        "number": 63,
        "repo": "schedwise",
        "title": "len(queue) still counts removed tasks; drain() then raises EmptyQueueError",
        "user": "nrhodes",
        "labels": ["bug", "taskqueue"],
        "created_at": "2025-02-10T19:44:20Z",
        "closed_at": "2025-02-12T08:27:31Z",
        "pull_request": 64,
        "merged_at": "2025-02-12T08:27:28Z",
        "changes": [
            (
                "schedwise/taskqueue.py",
                "    def __len__(self) -> int:\n        return len(self._entries)\n",
                "    def __len__(self) -> int:\n        return len(self._heap)\n",
            ),
        ],
        "tests": [("tests/test_issue_63.py",)],
    },
    # ------------------------------------------------- imperfect: the PR's tests do not reproduce the bug
    {
        "number": 38,
        "repo": "textkit",
        "title": "Placeholders written without spaces ({{name}}) are not rendered",
        "user": "bencho",
        "labels": ["bug", "template"],
        "created_at": "2024-08-19T10:30:00Z",
        "closed_at": "2024-08-21T17:18:12Z",
        "pull_request": 39,
        "merged_at": "2024-08-21T17:18:09Z",
        "changes": [
            (
                "textkit/template.py",
                '_PLACEHOLDER = re.compile(r"\\{\\{\\s*([A-Za-z_][\\w.]*)\\s*(?:\\|\\s*(\\w+)\\s*)?\\}\\}")\n',
                '_PLACEHOLDER = re.compile(r"\\{\\{ ([A-Za-z_][\\w.]*)(?: \\| (\\w+))? \\}\\}")\n',
            ),
        ],
        "tests": [("tests/test_issue_38.py",)],
    },
]


# Issue bodies as users wrote them: what they did, what they expected, what happened. Never the fix.
BODIES: dict[int, str] = {
    3: """
        We book invoice lines with ledgerlite and the totals are sometimes a cent off from the invoices our
        billing system produces.

        Minimal example (ledgerlite 0.4.1, Python 3.11.7):

        ```python
        >>> from ledgerlite import to_money
        >>> to_money("0.125")
        Decimal('0.12')
        >>> to_money("2.345")
        Decimal('2.34')
        >>> to_money("0.135")
        Decimal('0.14')
        ```

        So `0.125` goes down but `0.135` goes up. I expected a half cent to always round up (away from zero),
        i.e. `0.13` and `2.35`, which is what the invoices show and what the module docstring promises
        ("rounded the way invoices and bank statements are"). `parse_amount` has the same problem since it goes
        through `to_money`:

        ```python
        >>> parse_amount("$1,000.005")
        Decimal('1000.00')
        ```

        We have a lot of VAT lines at 12.5%, so this bites us on roughly every other invoice.
    """,
    6: """
        **Describe the bug**
        The balance of an account also includes accounts whose names merely *start with the same letters*,
        not only its real sub-accounts.

        **To reproduce**
        ```python
        import datetime as dt
        from ledgerlite import AccountType, Ledger, Transaction

        ledger = Ledger()
        ledger.open("Assets:Card", AccountType.ASSET)
        ledger.open("Assets:Cardholder:Deposit", AccountType.ASSET)
        ledger.open("Equity:Opening", AccountType.EQUITY)
        day = dt.date(2024, 2, 1)
        ledger.post(Transaction.simple(day, "Prepaid card", "Assets:Card", "Equity:Opening", "120.00"))
        ledger.post(Transaction.simple(day, "Deposit", "Assets:Cardholder:Deposit", "Equity:Opening", "500.00"))

        print(ledger.balance("Assets:Card"))
        print([a.name for a in ledger.chart.descendants("Assets:Card")])
        ```

        **Expected**
        ```
        120.00
        ['Assets:Card']
        ```

        **Actual**
        ```
        620.00
        ['Assets:Card', 'Assets:Cardholder', 'Assets:Cardholder:Deposit']
        ```

        `Assets:Cardholder` is a sibling of `Assets:Card`, not a child. The same thing happens with
        `Expenses:Car` and `Expenses:Career` in our real books, which is how I found it (our car costs doubled
        overnight).

        ledgerlite 0.4.1
    """,
    9: """
        `Ledger.balance(account, as_of=day)` is documented as the balance "at the end of day `as_of`", but
        transactions dated exactly on that day are not counted:

        ```python
        import datetime as dt
        from ledgerlite import AccountType, Ledger, Transaction

        ledger = Ledger()
        ledger.open("Assets:Checking", AccountType.ASSET)
        ledger.open("Income:Salary", AccountType.INCOME)
        payday = dt.date(2024, 2, 29)
        ledger.post(Transaction.simple(payday, "February salary", "Assets:Checking", "Income:Salary", "3100"))

        ledger.balance("Assets:Checking", as_of=payday)  # Decimal('0.00'), expected Decimal('3100.00')
        ledger.balance("Assets:Checking", as_of=dt.date(2024, 3, 1))  # Decimal('3100.00')
        ```

        This makes month-end balances wrong whenever something is booked on the last day of the month, which
        for salaries and bank fees is basically always. `trial_balance(as_of=...)` does include the
        transaction for the same date, so the two reports disagree with each other.
    """,
    11: """
        Our bank exports statements as CSV; I open them in Excel to fix up the account column and save them as
        "CSV UTF-8 (Comma delimited)". Loading the saved file then fails:

        ```
        Traceback (most recent call last):
          File "/Users/anna/books/import_march.py", line 9, in <module>
            transactions = load_csv("statements/2024-03.csv")
                           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
          File "/Users/anna/books/.venv/lib/python3.11/site-packages/ledgerlite/csvio.py", line 66, in load_csv
            return read_transactions(stream)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^
          File "/Users/anna/books/.venv/lib/python3.11/site-packages/ledgerlite/csvio.py", line 45, in read_transactions
            raise CsvFormatError(f"missing columns: {', '.join(missing)}")
        ledgerlite.errors.CsvFormatError: missing columns: date
        ```

        But the column is right there:

        ```
        $ head -2 statements/2024-03.csv
        date,txn_id,description,account,amount
        2024-03-01,1,Rent,Expenses:Rent,950.00
        ```

        `xxd` shows the file starts with the bytes `ef bb bf`, which Excel writes at the start of every UTF-8
        CSV. With those three bytes removed by hand the file loads fine. Saving as plain ASCII CSV is not an
        option because descriptions contain things like "Café Olé".

        ledgerlite 0.4.1, macOS 14, Python 3.11.
    """,
    14: """
        ```python
        import datetime as dt
        from ledgerlite import AccountType, Ledger

        ledger = Ledger()
        ledger.open("Assets:Checking", AccountType.ASSET)
        ledger.open("Assets:Savings", AccountType.ASSET)

        ledger.transfer(dt.date(2024, 4, 1), "Assets:Checking", "Assets:Savings", "100")
        ledger.balance("Assets:Savings")   # Decimal('-100.00')
        ledger.balance("Assets:Checking")  # Decimal('100.00')
        ```

        The signature is `transfer(date, source, destination, amount, ...)` and the docstring says it moves the
        amount *out of* `source` and *into* `destination`, but the result is the other way round: savings goes
        negative and checking goes up. Paying off a credit card with
        `transfer(day, "Assets:Checking", "Liabilities:CreditCard", "200")` increases what we owe instead of
        reducing it.

        The transaction itself is balanced, which is why this slipped through our reconciliation for a couple
        of weeks.
    """,
    17: """
        Running our year-end report:

        ```python
        import datetime as dt
        from ledgerlite import month_periods

        month_periods(dt.date(2024, 10, 1), dt.date(2025, 3, 31))
        ```

        ```
        Traceback (most recent call last):
          File "<stdin>", line 1, in <module>
          File "/srv/reports/.venv/lib/python3.11/site-packages/ledgerlite/reports.py", line 37, in month_periods
            first = first.replace(month=first.month + 1)
                    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
        ValueError: month must be in 1..12
        ```

        I expected six periods, 2024-10 through 2025-03. Any range that reaches December fails, even
        `month_periods(date(2024, 12, 1), date(2024, 12, 31))`, and so does `period_totals` for such ranges.
        Ranges within January to November work, so we only noticed when running the Q4 numbers.
    """,
    21: """
        ```python
        >>> from textkit import slugify
        >>> slugify("Crème Brûlée")
        'crme-brle'
        >>> slugify("São Paulo")
        'so-paulo'
        ```

        Expected `creme-brulee` and `sao-paulo`; the docstring even uses `"Crème Brûlée!" -> "creme-brulee"` as
        its example. We generate URLs for a recipe site where half of the titles are French or Portuguese, and
        the slugs come out unreadable. It also breaks de-duplication: `unique_slug("Café", {"cafe"})` returns
        `'caf'` instead of `'cafe-2'`.

        textkit 1.2.0, Python 3.11.
    """,
    24: """
        `wrap()` starts a new line even when the next word would fit exactly in `width`:

        ```python
        >>> from textkit import wrap
        >>> wrap("aaaa bbbbb", 10)
        ['aaaa', 'bbbbb']
        >>> import textwrap
        >>> textwrap.wrap("aaaa bbbbb", 10)
        ['aaaa bbbbb']
        ```

        `"aaaa bbbbb"` is exactly 10 characters, so I'd expect it to stay on one line, as with `textwrap`. We
        format commit message bodies with `fill(..., 72)` and lines come out shorter than they need to be; a CI
        check that compares against `textwrap` fails on every line that would be exactly 72 characters.
    """,
    27: """
        ```python
        >>> from textkit import ngrams
        >>> ngrams(["a", "b", "c"], 2)
        [('a', 'b')]
        >>> ngrams("abc", 3)
        []
        ```

        Expected `[('a', 'b'), ('b', 'c')]` and `[('a', 'b', 'c')]`; the docstring itself says
        `ngrams("abc", 2)` gives `[("a", "b"), ("b", "c")]`. Even unigrams lose the last token:
        `len(ngrams(words("to be or not to be"), 1))` is 5, not 6.

        This silently skews our bigram statistics, since every document loses its final bigram.
    """,
    29: """
        I compare optional fields with `similarity()` when de-duplicating customer records, and rows where both
        fields are empty crash:

        ```
        Traceback (most recent call last):
          File "/work/dedupe/match.py", line 58, in score
            return similarity(left.middle_name, right.middle_name)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
          File "/work/dedupe/.venv/lib/python3.11/site-packages/textkit/distance.py", line 31, in similarity
            return 1.0 - levenshtein(a, b) / longest
                         ~~~~~~~~~~~~~~~~~~^~~~~~~~~
        ZeroDivisionError: division by zero
        ```

        Two identical strings should score 1.0 whether or not they are empty (`levenshtein("", "")` is 0, after
        all). `similarity("", "abc")` works and returns 0.0.

        textkit 1.2.0
    """,
    33: """
        With the default `…` everything is fine, but with a three-character ellipsis the result is longer than
        the length I asked for:

        ```python
        >>> from textkit import truncate
        >>> truncate("hello world", 8, ellipsis="...")
        'hello w...'
        >>> len(_)
        10
        ```

        Expected `'hello...'` (8 characters); the docstring says "at most `length` characters, `ellipsis`
        included". We use this for SMS previews with a hard 160-character limit and ` [...]` as the marker, so
        messages get rejected by the gateway.

        For what it's worth, `truncate_middle` with the same arguments does respect the length.
    """,
    36: """
        `closest()` has `case_sensitive=False` as its default, so I expected it to ignore case unless told
        otherwise. It does the opposite:

        ```python
        >>> from textkit import closest
        >>> print(closest("PYTHON", ["java", "python"], max_distance=2))
        None
        >>> closest("PYTHON", ["java", "python"], max_distance=2, case_sensitive=True)
        'python'
        ```

        Expected `'python'` for the first call and `None` for the second. We use it for "did you mean ...?"
        suggestions on CLI subcommands, and anyone typing with caps lock on gets no suggestion at all.

        textkit 1.2.0
    """,
    38: """
        ```python
        >>> from textkit import render
        >>> render("Hello {{name}}!", {"name": "Ada"})
        'Hello {{name}}!'
        >>> render("Hello {{ name }}!", {"name": "Ada"})
        'Hello Ada!'
        ```

        The same happens with `{{ name|upper }}` (no spaces around the pipe) and with extra spaces such as
        `{{  name }}`. Jinja and Mustache accept all of these, and our templates come from a CMS where editors
        type them however they like. There is no error either, not even with `strict=True`: the placeholder
        just ends up in the output.
    """,
    52: """
        ```python
        import datetime as dt
        from schedwise import Agenda

        agenda = Agenda()
        agenda.add("Planning", dt.datetime(2024, 9, 2, 9), dt.datetime(2024, 9, 2, 10))
        agenda.add("Design review", dt.datetime(2024, 9, 2, 10), dt.datetime(2024, 9, 2, 11))
        print(agenda.conflicts())
        ```

        prints a conflict between *Planning* and *Design review*. Intervals are documented as half-open
        `[start, end)`, so a meeting ending at 10:00 and one starting at 10:00 should not clash. Related
        symptoms I noticed:

        * `Interval(9:00, 10:00).intersection(Interval(10:00, 11:00))` returns an empty interval
          `Interval(10:00, 10:00)` instead of `None`;
        * an event from 22:00 to midnight also shows up in `agenda.on()` for the *next* day.

        schedwise 0.2.3, Python 3.12
    """,
    55: """
        ```python
        import datetime as dt
        from schedwise import Frequency, Recurrence

        rent = Recurrence(dt.datetime(2024, 1, 31, 9, 0), Frequency.MONTHLY, count=6)
        list(rent.occurrences())
        ```

        ```
        Traceback (most recent call last):
          File "<stdin>", line 1, in <module>
          File "/home/rohan/.local/lib/python3.11/site-packages/schedwise/recurrence.py", line 51, in occurrences
            moment = self.nth(n)
                     ^^^^^^^^^^^
          File "/home/rohan/.local/lib/python3.11/site-packages/schedwise/recurrence.py", line 45, in nth
            return add_months(self.start, steps)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
          File "/home/rohan/.local/lib/python3.11/site-packages/schedwise/recurrence.py", line 21, in add_months
            return moment.replace(year=year, month=month)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
        ValueError: day is out of range for month
        ```

        I expected the occurrences to land on the last day of the shorter months: 2024-01-31, 2024-02-29,
        2024-03-31, 2024-04-30, and so on, the way rent due dates work. Starting on the 29th or 30th fails the
        same way, and so does `add_months(datetime(2024, 2, 29), 12)`.
    """,
    57: """
        ```python
        import datetime as dt
        from schedwise import WorkCalendar

        cal = WorkCalendar(holidays=[dt.date(2026, 7, 4)])  # a Saturday
        cal.workdays_between(dt.date(2026, 6, 29), dt.date(2026, 7, 6))     # 4
        len(cal.workdays(dt.date(2026, 6, 29), dt.date(2026, 7, 6)))        # 5
        ```

        Monday 29 June to Friday 3 July is five working days; a holiday on the Saturday should not take one of
        them away. `workdays()` gets it right and `workdays_between()` doesn't, so our SLA timer (which uses
        `workdays_between`) and the ticket UI (which lists `workdays`) disagree. We load public holidays from a
        feed that includes the ones falling on weekends, so this happens several times a year.

        schedwise 0.2.3
    """,
    60: """
        We keep one `WorkCalendar` per country office:

        ```python
        import datetime as dt
        from schedwise import WorkCalendar

        uk = WorkCalendar()
        uk.add_holiday(dt.date(2025, 8, 25))  # UK summer bank holiday

        us = WorkCalendar()
        us.is_workday(dt.date(2025, 8, 25))   # False ?!
        us.holidays                            # [datetime.date(2025, 8, 25)]
        ```

        Every calendar created without an explicit `holidays=` argument sees the holidays added to any other
        such calendar, for the rest of the process. And when a list *is* passed in, `add_holiday` modifies the
        caller's list:

        ```python
        bank_holidays = [dt.date(2025, 1, 1)]
        office = WorkCalendar(bank_holidays)
        office.add_holiday(dt.date(2025, 5, 1))
        bank_holidays  # [datetime.date(2025, 1, 1), datetime.date(2025, 5, 1)]
        ```

        It took us a while to find because it only shows up in our long-running worker, never in a fresh shell.
    """,
    63: """
        ```python
        from schedwise import PriorityTaskQueue

        queue = PriorityTaskQueue()
        queue.push("build", 1)
        queue.push("deploy", 2)
        queue.push("notify", 5)
        queue.remove("notify")

        print(len(queue))  # 3, expected 2
        queue.drain()
        ```

        ```
        Traceback (most recent call last):
          File "/opt/ci/runner.py", line 112, in run_pending
            for task in queue.drain():
                        ^^^^^^^^^^^^^
          File "/opt/ci/.venv/lib/python3.11/site-packages/schedwise/taskqueue.py", line 81, in drain
            tasks.append(self.pop())
                         ^^^^^^^^^^
          File "/opt/ci/.venv/lib/python3.11/site-packages/schedwise/taskqueue.py", line 72, in pop
            raise EmptyQueueError("pop from an empty queue")
        schedwise.taskqueue.EmptyQueueError: pop from an empty queue
        ```

        Re-pushing a task under a name that is already queued (which the docstring says replaces it) inflates
        `len()` the same way. `"notify" in queue` is correctly `False`; only the length and truthiness of the
        queue are off.
    """,
}

# Closed without a fix.
NOT_PLANNED: list[dict[str, Any]] = [
    {
        "number": 19,
        "title": "Support multiple currencies in one ledger",
        "body": """
            We keep our EUR and USD accounts in the same books. Every amount is a plain `Decimal`, so
            `Assets:Bank:EUR` and `Assets:Bank:USD` are simply added together when I ask for
            `balance("Assets:Bank")`, and `format_money` can only print one symbol per call.

            Would you consider:

            - a currency code on each account (or on each posting),
            - balances per currency (e.g. `dict[str, Decimal]`),
            - an exchange-rate table for reports, with an unrealized gain/loss account?

            Happy to help with a PR if we can agree on the design.
        """,
        "created_at": "2024-04-22T08:05:37Z",
        "closed_at": "2024-05-02T16:49:10Z",
        "user": "hnguyen-fin",
        "labels": ["enhancement", "wontfix"],
        "repository": "ledgerlite",
    },
]

# Held-out evaluation records. Five are bug reports on other (imaginary) projects; the one with
# "copy_of" reuses a ticket's body and fix verbatim: a leak the curation pipeline must catch.
HELDOUT: list[dict[str, Any]] = [
    {
        "instance_id": "quillmark__mdtable-142",
        "repo": "quillmark/mdtable",
        "problem_statement": """
            Tables containing Chinese/Japanese text or emoji are rendered with misaligned columns:

            ```python
            >>> print(render([["名前", "score"], ["Ada", "1"]]))
            | 名前 | score |
            |------|-------|
            | Ada  | 1     |
            ```

            In a terminal the first column of the header row is two cells wider than the rows below it.
            Each of those characters takes two columns on screen, but the padding seems to treat them as one.
        """,
        "files": [
            (
                "mdtable/width.py",
                '''\
                """Display width of table cells."""


                def cell_width(text: str) -> int:
                    return len(text)


                def pad(text: str, width: int) -> str:
                    return text + " " * (width - cell_width(text))
                ''',
                '''\
                """Display width of table cells."""

                import unicodedata


                def cell_width(text: str) -> int:
                    """Columns ``text`` takes in a monospace terminal; wide East Asian characters count twice."""
                    return sum(2 if unicodedata.east_asian_width(char) in ("W", "F") else 1 for char in text)


                def pad(text: str, width: int) -> str:
                    return text + " " * (width - cell_width(text))
                ''',
            ),
        ],
    },
    {
        "instance_id": "harborlabs__retryx-87",
        "repo": "harborlabs/retryx",
        "problem_statement": """
            `backoff_delay(attempt, max_delay=30, jitter=5)` can return up to 35 seconds once the exponential
            part reaches the cap. The README says `max_delay` is a hard upper bound ("never wait longer than
            this"), and our load balancer times out idle connections at 32 s, so retries after the cap fail.

            ```python
            >>> max(backoff_delay(10, max_delay=30.0, jitter=5.0) for _ in range(1000))
            34.98...
            ```
        """,
        "files": [
            (
                "retryx/backoff.py",
                '''\
                import random


                def backoff_delay(
                    attempt: int, base: float = 0.5, max_delay: float = 30.0, jitter: float = 0.0
                ) -> float:
                    """Seconds to wait before retry number ``attempt`` (0-based), at most ``max_delay``."""
                    delay = min(base * 2**attempt, max_delay)
                    return delay + random.uniform(0, jitter)
                ''',
                '''\
                import random


                def backoff_delay(
                    attempt: int, base: float = 0.5, max_delay: float = 30.0, jitter: float = 0.0
                ) -> float:
                    """Seconds to wait before retry number ``attempt`` (0-based), at most ``max_delay``."""
                    delay = base * 2**attempt + random.uniform(0, jitter)
                    return min(delay, max_delay)
                ''',
            ),
        ],
    },
    {
        "instance_id": "ferncode__inicfg-33",
        "repo": "ferncode/inicfg",
        "problem_statement": """
            Values that contain `=` are cut off at the second `=`:

            ```ini
            [db]
            url = postgres://app@db/main?sslmode=require
            ```

            ```python
            >>> inicfg.load("app.ini")["db"]["url"]
            'postgres://app@db/main?sslmode'
            ```

            Expected the whole value, `postgres://app@db/main?sslmode=require`. Base64 secrets ending in `==` are
            also truncated.
        """,
        "files": [
            (
                "inicfg/parser.py",
                '''\
                def parse_line(line: str) -> tuple[str, str] | None:
                    """Split one ``key = value`` line; None for blank lines and comments."""
                    line = line.strip()
                    if not line or line.startswith((";", "#")):
                        return None
                    parts = line.split("=")
                    if len(parts) < 2:
                        raise SyntaxError(f"expected 'key = value': {line!r}")
                    return parts[0].strip(), parts[1].strip()
                ''',
                '''\
                def parse_line(line: str) -> tuple[str, str] | None:
                    """Split one ``key = value`` line; None for blank lines and comments."""
                    line = line.strip()
                    if not line or line.startswith((";", "#")):
                        return None
                    key, sep, value = line.partition("=")
                    if not sep:
                        raise SyntaxError(f"expected 'key = value': {line!r}")
                    return key.strip(), value.strip()
                ''',
            ),
        ],
    },
    {
        "instance_id": "pixelhut__colorconv-58",
        "repo": "pixelhut/colorconv",
        "problem_statement": """
            `hex_to_rgb` rejects CSS shorthand colours:

            ```
            >>> hex_to_rgb("#fa0")
            ValueError: not a hex colour: '#fa0'
            ```

            `#fa0` is valid CSS for `#ffaa00`, and our theme files use the short form everywhere. Expected
            `(255, 170, 0)`.
        """,
        "files": [
            (
                "colorconv/hexcolor.py",
                """\
                def hex_to_rgb(value: str) -> tuple[int, int, int]:
                    digits = value.lstrip("#")
                    if len(digits) != 6:
                        raise ValueError(f"not a hex colour: {value!r}")
                    red, green, blue = (int(digits[i : i + 2], 16) for i in (0, 2, 4))
                    return red, green, blue
                """,
                """\
                def hex_to_rgb(value: str) -> tuple[int, int, int]:
                    digits = value.lstrip("#")
                    if len(digits) == 3:
                        digits = "".join(char * 2 for char in digits)
                    if len(digits) != 6:
                        raise ValueError(f"not a hex colour: {value!r}")
                    red, green, blue = (int(digits[i : i + 2], 16) for i in (0, 2, 4))
                    return red, green, blue
                """,
            ),
        ],
    },
    {
        "instance_id": "linebreak__mdlint-71",
        "repo": "linebreak/mdlint",
        "problem_statement": """
            MD012 ("multiple consecutive blank lines") is reported inside fenced code blocks, where blank lines
            are part of the content. For example, this README triggers MD012 on line 6:

            ````markdown
            Example:

            ```python
            import os


            def main(): ...
            ```
            ````

            Expected no warning: two blank lines between top-level definitions are what PEP 8 asks for.
        """,
        "files": [
            (
                "mdlint/rules/blank_lines.py",
                '''\
                def check_blank_lines(lines: list[str], maximum: int = 1) -> list[int]:
                    """1-based numbers of lines where a run of more than ``maximum`` blank lines starts to exceed it."""
                    problems = []
                    run = 0
                    for number, line in enumerate(lines, start=1):
                        if line.strip():
                            run = 0
                            continue
                        run += 1
                        if run == maximum + 1:
                            problems.append(number)
                    return problems
                ''',
                '''\
                def check_blank_lines(lines: list[str], maximum: int = 1) -> list[int]:
                    """1-based numbers of lines where a run of more than ``maximum`` blank lines starts to exceed it."""
                    problems = []
                    run = 0
                    in_fence = False
                    for number, line in enumerate(lines, start=1):
                        if line.lstrip().startswith(("```", "~~~")):
                            in_fence = not in_fence
                        if in_fence or line.strip():
                            run = 0
                            continue
                        run += 1
                        if run == maximum + 1:
                            problems.append(number)
                    return problems
                ''',
            ),
        ],
    },
    {"instance_id": "trialforge-samples__schedwise-57", "repo": "trialforge-samples/schedwise", "copy_of": 57},
]
