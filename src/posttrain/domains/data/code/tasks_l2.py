"""Level 2 `code` tasks, written for posttrain: parsing, intervals, stacks,
ordering rules, and one small class. Same fields as tasks_l1; a class task
has kind="class" and inputs that are call sequences [[method, args], ...]."""

TASKS = [
    dict(
        name="brackets_balanced", prompt="Write `brackets_balanced(s)` returning True if every (, [ and { in s is closed by the matching bracket in the right order; other characters are ignored.",
        solution="def brackets_balanced(s):\n    pairs = {')': '(', ']': '[', '}': '{'}\n    st = []\n    for c in s:\n        if c in '([{':\n            st.append(c)\n        elif c in pairs:\n            if not st or st.pop() != pairs[c]:\n                return False\n    return not st\n",
        wrong="def brackets_balanced(s):\n    return all(s.count(a) == s.count(b) for a, b in ('()', '[]', '{}'))\n",
        inputs=[["([]{})"], ["([)]"], [""], ["((("], ["a(b)c[d]"], [")("], ["{[()()]}"]],
    ),
    dict(
        name="roman_to_int", prompt="Write `roman_to_int(s)` converting a valid Roman numeral (I, V, X, L, C, D, M with subtractive pairs like IV and CM) to an integer.",
        solution="def roman_to_int(s):\n    v = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n    total = 0\n    for i, c in enumerate(s):\n        if i + 1 < len(s) and v[c] < v[s[i + 1]]:\n            total -= v[c]\n        else:\n            total += v[c]\n    return total\n",
        wrong="def roman_to_int(s):\n    v = {'I': 1, 'V': 5, 'X': 10, 'L': 50, 'C': 100, 'D': 500, 'M': 1000}\n    return sum(v[c] for c in s)\n",
        inputs=[["III"], ["IV"], ["MCMXCIV"], ["LVIII"], ["MMXXVI"], ["XLIX"]],
    ),
    dict(
        name="int_to_roman", prompt="Write `int_to_roman(n)` converting 1 <= n <= 3999 to a Roman numeral using subtractive notation (4 = IV, 900 = CM).",
        solution="def int_to_roman(n):\n    table = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'), (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n    out = []\n    for v, s in table:\n        while n >= v:\n            out.append(s)\n            n -= v\n    return ''.join(out)\n",
        wrong="def int_to_roman(n):\n    table = [(1000, 'M'), (500, 'D'), (100, 'C'), (50, 'L'), (10, 'X'), (5, 'V'), (1, 'I')]\n    out = []\n    for v, s in table:\n        while n >= v:\n            out.append(s)\n            n -= v\n    return ''.join(out)\n",
        inputs=[[1], [4], [1994], [3999], [58], [2026]],
    ),
    dict(
        name="anagram_groups", prompt="Write `anagram_groups(words)` grouping words that are anagrams of each other. Return a list of groups ordered by the first appearance of each group; inside a group keep the input order.",
        solution="def anagram_groups(words):\n    groups = {}\n    for w in words:\n        groups.setdefault(''.join(sorted(w)), []).append(w)\n    return list(groups.values())\n",
        wrong="def anagram_groups(words):\n    groups = {}\n    for w in words:\n        groups.setdefault(''.join(sorted(w)), []).append(w)\n    return [sorted(g) for g in groups.values()]\n",
        inputs=[[["eat", "tea", "tan", "ate", "nat", "bat"]], [[]], [["abc"]], [["ba", "ab", "ab"]], [["listen", "google", "silent", "enlist"]]],
    ),
    dict(
        name="top_k_words", prompt="Write `top_k_words(words, k)` returning the k most frequent words, most frequent first, ties broken alphabetically.",
        solution="def top_k_words(words, k):\n    from collections import Counter\n    c = Counter(words)\n    return sorted(c, key=lambda w: (-c[w], w))[:k]\n",
        wrong="def top_k_words(words, k):\n    from collections import Counter\n    return [w for w, _ in Counter(words).most_common(k)]\n",
        inputs=[[["b", "a", "b", "c", "a", "d"], 2], [["x"], 1], [["to", "be", "or", "not", "to", "be"], 3], [["q", "p", "r"], 2], [[], 2]],
    ),
    dict(
        name="spiral_order", prompt="Write `spiral_order(matrix)` returning the elements of a rectangular list-of-lists matrix in clockwise spiral order starting at the top-left.",
        solution="def spiral_order(matrix):\n    out = []\n    m = [list(r) for r in matrix]\n    while m:\n        out += m.pop(0)\n        m = [list(r) for r in zip(*m)][::-1]\n    return out\n",
        wrong="def spiral_order(matrix):\n    out = []\n    for i, row in enumerate(matrix):\n        out += row if i % 2 == 0 else row[::-1]\n    return out\n",
        inputs=[[[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], [[[1, 2], [3, 4], [5, 6]]], [[]], [[[7]]], [[[1, 2, 3, 4]]], [[[1], [2], [3]]]],
    ),
    dict(
        name="merge_intervals", prompt="Write `merge_intervals(intervals)` merging overlapping or touching closed intervals [start, end]; return the merged list sorted by start.",
        solution="def merge_intervals(intervals):\n    out = []\n    for s, e in sorted(intervals):\n        if out and s <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], e)\n        else:\n            out.append([s, e])\n    return out\n",
        wrong="def merge_intervals(intervals):\n    out = []\n    for s, e in sorted(intervals):\n        if out and s < out[-1][1]:\n            out[-1][1] = e\n        else:\n            out.append([s, e])\n    return out\n",
        inputs=[[[[1, 3], [2, 6], [8, 10]]], [[[1, 4], [4, 5]]], [[]], [[[5, 6], [1, 10]]], [[[1, 2], [3, 4]]], [[[2, 3], [1, 8], [4, 5]]]],
    ),
    dict(
        name="common_prefix", prompt="Write `common_prefix(strs)` returning the longest common prefix of a list of strings ('' for an empty list).",
        solution="def common_prefix(strs):\n    if not strs:\n        return ''\n    p = strs[0]\n    for s in strs[1:]:\n        while not s.startswith(p):\n            p = p[:-1]\n    return p\n",
        wrong="def common_prefix(strs):\n    if not strs:\n        return ''\n    p = ''\n    for chars in zip(*strs):\n        if len(set(chars)) == 1:\n            p += chars[0]\n    return p\n",
        inputs=[[["flower", "flow", "flight"]], [["dog", "racecar"]], [[]], [["same", "same"]], [["abcx", "abdx"]], [["a"]]],
    ),
    dict(
        name="valid_ipv4", prompt="Write `valid_ipv4(s)` returning True if s is a dotted-quad IPv4 address: four decimal parts 0..255, digits only, no leading zeros (except '0' itself).",
        solution="def valid_ipv4(s):\n    parts = s.split('.')\n    if len(parts) != 4:\n        return False\n    for p in parts:\n        if not p.isdigit() or not p.isascii() or (len(p) > 1 and p[0] == '0') or int(p) > 255:\n            return False\n    return True\n",
        wrong="def valid_ipv4(s):\n    parts = s.split('.')\n    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts)\n",
        inputs=[["192.168.0.1"], ["256.1.1.1"], ["1.2.3"], ["01.2.3.4"], ["0.0.0.0"], ["1.2.3.4.5"], ["a.b.c.d"], ["1..2.3"]],
    ),
    dict(
        name="caesar_shift", prompt="Write `caesar_shift(text, k)` shifting each ASCII letter of text k places through the alphabet (wrapping, keeping case; k may be negative or large); other characters are unchanged.",
        solution="def caesar_shift(text, k):\n    out = []\n    for c in text:\n        if 'a' <= c <= 'z':\n            out.append(chr((ord(c) - 97 + k) % 26 + 97))\n        elif 'A' <= c <= 'Z':\n            out.append(chr((ord(c) - 65 + k) % 26 + 65))\n        else:\n            out.append(c)\n    return ''.join(out)\n",
        wrong="def caesar_shift(text, k):\n    return ''.join(chr((ord(c) - 97 + k) % 26 + 97) if c.isalpha() else c for c in text.lower())\n",
        inputs=[["abc", 1], ["xyz", 3], ["Hello, World!", 13], ["abc", -1], ["Zz", 52], ["", 5]],
    ),
    dict(
        name="wrap_text", prompt="Write `wrap_text(text, width)` greedily packing the whitespace-separated words of text into lines of at most width characters (words joined by one space); a word longer than width gets a line of its own. Return the list of lines.",
        solution="def wrap_text(text, width):\n    lines, cur = [], ''\n    for w in text.split():\n        if not cur:\n            cur = w\n        elif len(cur) + 1 + len(w) <= width:\n            cur += ' ' + w\n        else:\n            lines.append(cur)\n            cur = w\n    if cur:\n        lines.append(cur)\n    return lines\n",
        wrong="def wrap_text(text, width):\n    lines, cur = [], ''\n    for w in text.split():\n        if len(cur) + len(w) <= width:\n            cur = (cur + ' ' + w).strip()\n        else:\n            lines.append(cur)\n            cur = w\n    if cur:\n        lines.append(cur)\n    return lines\n",
        inputs=[["the quick brown fox jumps over the lazy dog", 10], ["", 5], ["supercalifragilistic is long", 8], ["a b c d", 3], ["exactly ten", 11]],
    ),
    dict(
        name="summarize_ranges", prompt="Write `summarize_ranges(nums)` for a sorted list of distinct integers, returning a string of comma-separated runs: '1-3,5,7-8' for [1,2,3,5,7,8].",
        solution="def summarize_ranges(nums):\n    out, i = [], 0\n    while i < len(nums):\n        j = i\n        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:\n            j += 1\n        out.append(str(nums[i]) if i == j else f'{nums[i]}-{nums[j]}')\n        i = j + 1\n    return ','.join(out)\n",
        wrong="def summarize_ranges(nums):\n    out, i = [], 0\n    while i < len(nums):\n        j = i\n        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:\n            j += 1\n        out.append(f'{nums[i]}-{nums[j]}')\n        i = j + 1\n    return ','.join(out)\n",
        inputs=[[[1, 2, 3, 5, 7, 8]], [[]], [[4]], [[-3, -2, 0, 1]], [[1, 3, 5]]],
    ),
    dict(
        name="parse_duration", prompt="Write `parse_duration(s)` converting strings like '1h30m', '45s', '2h5s' or '3d4h' (units d, h, m, s, each at most once, in that order) to a number of seconds.",
        solution="def parse_duration(s):\n    import re\n    units = {'d': 86400, 'h': 3600, 'm': 60, 's': 1}\n    return sum(int(n) * units[u] for n, u in re.findall(r'(\\d+)([dhms])', s))\n",
        wrong="def parse_duration(s):\n    import re\n    units = {'h': 3600, 'm': 60, 's': 1}\n    return sum(int(n) * units.get(u, 0) for n, u in re.findall(r'(\\d+)([dhms])', s))\n",
        inputs=[["1h30m"], ["45s"], ["2h5s"], ["3d4h"], ["10m"], ["1d1h1m1s"]],
    ),
    dict(
        name="longest_rising_run", prompt="Write `longest_rising_run(nums)` returning the length of the longest contiguous strictly increasing run in nums (0 for an empty list).",
        solution="def longest_rising_run(nums):\n    best = cur = 0\n    for i, x in enumerate(nums):\n        cur = cur + 1 if i and x > nums[i - 1] else 1\n        best = max(best, cur)\n    return best\n",
        wrong="def longest_rising_run(nums):\n    best = cur = 0\n    for i, x in enumerate(nums):\n        cur = cur + 1 if i and x >= nums[i - 1] else 1\n        best = max(best, cur)\n    return best\n",
        inputs=[[[1, 2, 2, 3, 4, 1]], [[]], [[5, 4, 3]], [[1, 2, 3, 4]], [[3, 3, 3]]],
    ),
    dict(
        name="insert_position", prompt="Write `insert_position(nums, x)` returning the leftmost index at which x can be inserted into the ascending list nums keeping it sorted.",
        solution="def insert_position(nums, x):\n    lo, hi = 0, len(nums)\n    while lo < hi:\n        mid = (lo + hi) // 2\n        if nums[mid] < x:\n            lo = mid + 1\n        else:\n            hi = mid\n    return lo\n",
        wrong="def insert_position(nums, x):\n    lo, hi = 0, len(nums)\n    while lo < hi:\n        mid = (lo + hi) // 2\n        if nums[mid] <= x:\n            lo = mid + 1\n        else:\n            hi = mid\n    return lo\n",
        inputs=[[[1, 3, 5, 6], 5], [[1, 3, 5, 6], 2], [[], 7], [[1, 1, 1], 1], [[2, 4], 9], [[2, 4], -1]],
    ),
    dict(
        name="simplify_path", prompt="Write `simplify_path(path)` simplifying an absolute Unix path: collapse repeated slashes, drop '.', let '..' remove the previous directory (never above root), no trailing slash except for '/'.",
        solution="def simplify_path(path):\n    st = []\n    for part in path.split('/'):\n        if part == '..':\n            if st:\n                st.pop()\n        elif part and part != '.':\n            st.append(part)\n    return '/' + '/'.join(st)\n",
        wrong="def simplify_path(path):\n    st = []\n    for part in path.split('/'):\n        if part == '..':\n            st.pop()\n        elif part and part != '.':\n            st.append(part)\n    return '/' + '/'.join(st)\n",
        inputs=[["/a/./b/../../c/"], ["/../"], ["/home//user/"], ["/"], ["/a/b/c/../.."], ["/.../x"]],
    ),
    dict(
        name="majority_element", prompt="Write `majority_element(nums)` returning the value that occurs more than len(nums) // 2 times, or None if there is none.",
        solution="def majority_element(nums):\n    from collections import Counter\n    for v, c in Counter(nums).items():\n        if c > len(nums) // 2:\n            return v\n    return None\n",
        wrong="def majority_element(nums):\n    from collections import Counter\n    return Counter(nums).most_common(1)[0][0] if nums else None\n",
        inputs=[[[3, 2, 3]], [[1, 2, 3]], [[]], [[2, 2, 1, 1, 2]], [[1, 1, 2, 2]], [[7]]],
    ),
    dict(
        name="next_permutation", prompt="Write `next_permutation(nums)` returning the lexicographically next permutation of the list nums as a new list, or the smallest (ascending) permutation if nums is the largest.",
        solution="def next_permutation(nums):\n    a = list(nums)\n    i = len(a) - 2\n    while i >= 0 and a[i] >= a[i + 1]:\n        i -= 1\n    if i >= 0:\n        j = len(a) - 1\n        while a[j] <= a[i]:\n            j -= 1\n        a[i], a[j] = a[j], a[i]\n    a[i + 1:] = reversed(a[i + 1:])\n    return a\n",
        wrong="def next_permutation(nums):\n    a = list(nums)\n    i = len(a) - 2\n    while i >= 0 and a[i] >= a[i + 1]:\n        i -= 1\n    if i < 0:\n        return sorted(a)\n    a[i], a[i + 1] = a[i + 1], a[i]\n    return a\n",
        inputs=[[[1, 2, 3]], [[3, 2, 1]], [[1, 1, 5]], [[1, 3, 2]], [[2, 3, 1]], [[]]],
    ),
    dict(
        name="eval_rpn", prompt="Write `eval_rpn(tokens)` evaluating a list of reverse-Polish tokens over integers with + - * /, where / truncates toward zero.",
        solution="def eval_rpn(tokens):\n    st = []\n    for t in tokens:\n        if t in ('+', '-', '*', '/'):\n            b, a = st.pop(), st.pop()\n            if t == '+': st.append(a + b)\n            elif t == '-': st.append(a - b)\n            elif t == '*': st.append(a * b)\n            else: st.append(int(a / b))\n        else:\n            st.append(int(t))\n    return st[-1]\n",
        wrong="def eval_rpn(tokens):\n    st = []\n    for t in tokens:\n        if t in ('+', '-', '*', '/'):\n            b, a = st.pop(), st.pop()\n            if t == '+': st.append(a + b)\n            elif t == '-': st.append(a - b)\n            elif t == '*': st.append(a * b)\n            else: st.append(a // b)\n        else:\n            st.append(int(t))\n    return st[-1]\n",
        inputs=[[["2", "1", "+", "3", "*"]], [["4", "13", "5", "/", "+"]], [["7", "-2", "/"]], [["5"]], [["3", "4", "-", "10", "*"]]],
    ),
    dict(
        name="MinStack", kind="class", prompt="Write a class `MinStack` with push(x), pop() (returns the removed value), top() and get_min(), each in O(1).",
        solution="class MinStack:\n    def __init__(self):\n        self.st = []\n    def push(self, x):\n        m = min(x, self.st[-1][1]) if self.st else x\n        self.st.append((x, m))\n    def pop(self):\n        return self.st.pop()[0]\n    def top(self):\n        return self.st[-1][0]\n    def get_min(self):\n        return self.st[-1][1]\n",
        wrong="class MinStack:\n    def __init__(self):\n        self.st = []\n        self.m = None\n    def push(self, x):\n        self.st.append(x)\n        self.m = x if self.m is None else min(self.m, x)\n    def pop(self):\n        return self.st.pop()\n    def top(self):\n        return self.st[-1]\n    def get_min(self):\n        return self.m\n",
        inputs=[
            [["__init__", []], ["push", [3]], ["push", [5]], ["get_min", []], ["push", [1]], ["get_min", []], ["pop", []], ["get_min", []]],
            [["__init__", []], ["push", [2]], ["push", [2]], ["pop", []], ["get_min", []], ["top", []]],
            [["__init__", []], ["push", [-1]], ["push", [4]], ["top", []], ["get_min", []]],
        ],
    ),
]
