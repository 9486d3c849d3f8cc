"""Level 3 `code` tasks, written for posttrain: dynamic programming, graphs,
search, parsing and stateful classes. Same fields as tasks_l1."""

TASKS = [
    dict(
        name="edit_distance", prompt="Write `edit_distance(a, b)` returning the minimum number of single-character insertions, deletions and substitutions turning string a into string b.",
        solution="def edit_distance(a, b):\n    prev = list(range(len(b) + 1))\n    for i, ca in enumerate(a, 1):\n        cur = [i]\n        for j, cb in enumerate(b, 1):\n            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))\n        prev = cur\n    return prev[-1]\n",
        wrong="def edit_distance(a, b):\n    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))\n",
        inputs=[["kitten", "sitting"], ["", "abc"], ["same", "same"], ["flaw", "lawn"], ["intention", "execution"], ["ab", ""]],
    ),
    dict(
        name="lis_length", prompt="Write `lis_length(nums)` returning the length of the longest strictly increasing subsequence (not necessarily contiguous).",
        solution="def lis_length(nums):\n    import bisect\n    tails = []\n    for x in nums:\n        i = bisect.bisect_left(tails, x)\n        if i == len(tails):\n            tails.append(x)\n        else:\n            tails[i] = x\n    return len(tails)\n",
        wrong="def lis_length(nums):\n    import bisect\n    tails = []\n    for x in nums:\n        i = bisect.bisect_right(tails, x)\n        if i == len(tails):\n            tails.append(x)\n        else:\n            tails[i] = x\n    return len(tails)\n",
        inputs=[[[10, 9, 2, 5, 3, 7, 101, 18]], [[]], [[7, 7, 7]], [[1, 2, 3]], [[3, 1, 2, 1, 8, 5, 6]]],
    ),
    dict(
        name="coin_ways", prompt="Write `coin_ways(amount, coins)` returning the number of distinct multisets of coins (unlimited supply of each denomination) that sum to amount; amount 0 has one way.",
        solution="def coin_ways(amount, coins):\n    ways = [1] + [0] * amount\n    for c in coins:\n        for a in range(c, amount + 1):\n            ways[a] += ways[a - c]\n    return ways[amount]\n",
        wrong="def coin_ways(amount, coins):\n    ways = [1] + [0] * amount\n    for a in range(1, amount + 1):\n        for c in coins:\n            if c <= a:\n                ways[a] += ways[a - c]\n    return ways[amount]\n",
        inputs=[[5, [1, 2, 5]], [3, [2]], [0, [7]], [10, [10]], [12, [1, 3, 4]]],
    ),
    dict(
        name="fewest_coins", prompt="Write `fewest_coins(amount, coins)` returning the fewest coins (unlimited supply) summing to amount, or -1 if impossible.",
        solution="def fewest_coins(amount, coins):\n    INF = float('inf')\n    best = [0] + [INF] * amount\n    for a in range(1, amount + 1):\n        for c in coins:\n            if c <= a and best[a - c] + 1 < best[a]:\n                best[a] = best[a - c] + 1\n    return -1 if best[amount] == INF else best[amount]\n",
        wrong="def fewest_coins(amount, coins):\n    n = 0\n    for c in sorted(coins, reverse=True):\n        n += amount // c\n        amount %= c\n    return n if amount == 0 else -1\n",
        inputs=[[11, [1, 2, 5]], [3, [2]], [0, [1]], [6, [1, 3, 4]], [7, [2, 4]], [27, [1, 5, 6, 9]]],
    ),
    dict(
        name="LRUCache", kind="class", prompt="Write a class `LRUCache(capacity)` with get(key) (the value, or -1 if absent; marks the key as recently used) and put(key, value) (inserts or updates; when over capacity evicts the least recently used key).",
        solution="class LRUCache:\n    def __init__(self, capacity):\n        from collections import OrderedDict\n        self.cap = capacity\n        self.d = OrderedDict()\n    def get(self, key):\n        if key not in self.d:\n            return -1\n        self.d.move_to_end(key)\n        return self.d[key]\n    def put(self, key, value):\n        self.d[key] = value\n        self.d.move_to_end(key)\n        if len(self.d) > self.cap:\n            self.d.popitem(last=False)\n",
        wrong="class LRUCache:\n    def __init__(self, capacity):\n        self.cap = capacity\n        self.d = {}\n    def get(self, key):\n        return self.d.get(key, -1)\n    def put(self, key, value):\n        self.d[key] = value\n        if len(self.d) > self.cap:\n            del self.d[next(iter(self.d))]\n",
        inputs=[
            [["__init__", [2]], ["put", [1, 1]], ["put", [2, 2]], ["get", [1]], ["put", [3, 3]], ["get", [2]], ["get", [3]], ["get", [1]]],
            [["__init__", [1]], ["put", [5, 50]], ["put", [5, 55]], ["get", [5]], ["put", [6, 60]], ["get", [5]]],
            [["__init__", [2]], ["get", [9]], ["put", [1, 10]], ["put", [2, 20]], ["put", [1, 11]], ["put", [3, 30]], ["get", [2]], ["get", [1]]],
        ],
    ),
    dict(
        name="topo_order", prompt="Write `topo_order(n, edges)` for nodes 0..n-1 and directed edges [u, v] (u before v): return the lexicographically smallest topological order as a list, or [] if there is a cycle.",
        solution="def topo_order(n, edges):\n    import heapq\n    indeg = [0] * n\n    adj = [[] for _ in range(n)]\n    for u, v in edges:\n        adj[u].append(v)\n        indeg[v] += 1\n    heap = [i for i in range(n) if indeg[i] == 0]\n    heapq.heapify(heap)\n    out = []\n    while heap:\n        u = heapq.heappop(heap)\n        out.append(u)\n        for v in adj[u]:\n            indeg[v] -= 1\n            if indeg[v] == 0:\n                heapq.heappush(heap, v)\n    return out if len(out) == n else []\n",
        wrong="def topo_order(n, edges):\n    indeg = [0] * n\n    adj = [[] for _ in range(n)]\n    for u, v in edges:\n        adj[u].append(v)\n        indeg[v] += 1\n    queue = [i for i in range(n) if indeg[i] == 0]\n    out = []\n    while queue:\n        u = queue.pop(0)\n        out.append(u)\n        for v in adj[u]:\n            indeg[v] -= 1\n            if indeg[v] == 0:\n                queue.append(v)\n    return out\n",
        inputs=[[4, [[1, 0], [2, 0], [3, 1]]], [3, [[0, 1], [1, 2], [2, 0]]], [3, []], [5, [[4, 0], [3, 0], [0, 1], [2, 1]]], [1, []], [4, [[1, 0]]], [4, [[0, 1], [1, 2], [2, 1]]]],
    ),
    dict(
        name="grid_path_length", prompt="Write `grid_path_length(grid)`: grid is a list of equal-length strings of '.' (open) and '#' (wall). Return the fewest 4-directional steps from the top-left to the bottom-right cell, or -1 if unreachable or either end is a wall.",
        solution="def grid_path_length(grid):\n    from collections import deque\n    h, w = len(grid), len(grid[0])\n    if grid[0][0] == '#' or grid[h - 1][w - 1] == '#':\n        return -1\n    dist = {(0, 0): 0}\n    q = deque([(0, 0)])\n    while q:\n        r, c = q.popleft()\n        if (r, c) == (h - 1, w - 1):\n            return dist[(r, c)]\n        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):\n            nr, nc = r + dr, c + dc\n            if 0 <= nr < h and 0 <= nc < w and grid[nr][nc] == '.' and (nr, nc) not in dist:\n                dist[(nr, nc)] = dist[(r, c)] + 1\n                q.append((nr, nc))\n    return -1\n",
        wrong="def grid_path_length(grid):\n    h, w = len(grid), len(grid[0])\n    if grid[0][0] == '#' or grid[h - 1][w - 1] == '#':\n        return -1\n    return h + w - 2\n",
        inputs=[[["..", ".."]], [[".#", "#."]], [["...", "##.", "..."]], [["."]], [["..#.", "#...", "..#.", "#..."]], [["....", ".##.", ".#..", "...#"]]],
    ),
    dict(
        name="eval_arith", prompt="Write `eval_arith(expr)` evaluating an integer expression with + - * /, parentheses, spaces and unary minus, with the usual precedence; / truncates toward zero. Do not use eval.",
        solution="def eval_arith(expr):\n    toks = []\n    i = 0\n    while i < len(expr):\n        c = expr[i]\n        if c.isdigit():\n            j = i\n            while j < len(expr) and expr[j].isdigit():\n                j += 1\n            toks.append(int(expr[i:j])); i = j; continue\n        if c in '+-*/()':\n            toks.append(c)\n        i += 1\n    pos = 0\n    def peek():\n        return toks[pos] if pos < len(toks) else None\n    def take():\n        nonlocal pos\n        pos += 1\n        return toks[pos - 1]\n    def expr_():\n        v = term()\n        while peek() in ('+', '-'):\n            v = v + term() if take() == '+' else v - term()\n        return v\n    def term():\n        v = unary()\n        while peek() in ('*', '/'):\n            if take() == '*':\n                v = v * unary()\n            else:\n                d = unary(); v = abs(v) // abs(d) * (1 if (v >= 0) == (d >= 0) else -1)\n        return v\n    def unary():\n        if peek() == '-':\n            take(); return -unary()\n        if peek() == '+':\n            take(); return unary()\n        t = take()\n        if t == '(':\n            v = expr_(); take(); return v\n        return t\n    return expr_()\n",
        wrong="def eval_arith(expr):\n    toks = expr.replace('(', ' ').replace(')', ' ')\n    for op in '+-*/':\n        toks = toks.replace(op, f' {op} ')\n    parts = toks.split()\n    v = int(parts[0])\n    for op, n in zip(parts[1::2], parts[2::2]):\n        n = int(n)\n        v = v + n if op == '+' else v - n if op == '-' else v * n if op == '*' else int(v / n)\n    return v\n",
        inputs=[["1 + 2 * 3"], ["(1 + 2) * 3"], ["7 / -2"], ["-(4 - 10) * 2"], ["100"], ["2 * (3 + 4) - 5 / 2"]],
    ),
    dict(
        name="queens_count", prompt="Write `queens_count(n)` returning the number of ways to place n non-attacking queens on an n x n board (n >= 1).",
        solution="def queens_count(n):\n    def go(r, cols, d1, d2):\n        if r == n:\n            return 1\n        t = 0\n        for c in range(n):\n            if c not in cols and r - c not in d1 and r + c not in d2:\n                t += go(r + 1, cols | {c}, d1 | {r - c}, d2 | {r + c})\n        return t\n    return go(0, frozenset(), frozenset(), frozenset())\n",
        wrong="def queens_count(n):\n    def go(r, cols):\n        if r == n:\n            return 1\n        return sum(go(r + 1, cols | {c}) for c in range(n) if c not in cols)\n    return go(0, frozenset())\n",
        inputs=[[1], [4], [5], [6], [2]],
    ),
    dict(
        name="can_segment", prompt="Write `can_segment(s, words)` returning True if s can be split into a sequence of one or more words from the list words (words may repeat).",
        solution="def can_segment(s, words):\n    ws = set(words)\n    ok = [True] + [False] * len(s)\n    for i in range(1, len(s) + 1):\n        ok[i] = any(ok[j] and s[j:i] in ws for j in range(i))\n    return ok[-1]\n",
        wrong="def can_segment(s, words):\n    for w in sorted(words, key=len, reverse=True):\n        s = s.replace(w, '')\n    return s == ''\n",
        inputs=[["leetcode", ["leet", "code"]], ["catsandog", ["cats", "dog", "sand", "and", "cat"]], ["aaaaaaa", ["aaaa", "aaa"]], ["", ["a"]], ["abcd", ["a", "abc", "b", "cd"]], ["applepenapple", ["apple", "pen"]]],
    ),
    dict(
        name="shortest_distances", prompt="Write `shortest_distances(n, edges, src)` for nodes 0..n-1 and undirected weighted edges [u, v, w] (w >= 0): return the list of shortest distances from src, with -1 for unreachable nodes.",
        solution="def shortest_distances(n, edges, src):\n    import heapq\n    adj = [[] for _ in range(n)]\n    for u, v, w in edges:\n        adj[u].append((v, w)); adj[v].append((u, w))\n    dist = [None] * n\n    heap = [(0, src)]\n    while heap:\n        d, u = heapq.heappop(heap)\n        if dist[u] is not None:\n            continue\n        dist[u] = d\n        for v, w in adj[u]:\n            if dist[v] is None:\n                heapq.heappush(heap, (d + w, v))\n    return [-1 if d is None else d for d in dist]\n",
        wrong="def shortest_distances(n, edges, src):\n    from collections import deque\n    adj = [[] for _ in range(n)]\n    for u, v, w in edges:\n        adj[u].append((v, w)); adj[v].append((u, w))\n    dist = [-1] * n\n    dist[src] = 0\n    q = deque([src])\n    while q:\n        u = q.popleft()\n        for v, w in adj[u]:\n            if dist[v] == -1:\n                dist[v] = dist[u] + w\n                q.append(v)\n    return dist\n",
        inputs=[[4, [[0, 1, 4], [0, 2, 1], [2, 1, 2], [1, 3, 5]], 0], [3, [[0, 1, 7]], 2], [1, [], 0], [5, [[0, 1, 1], [1, 2, 1], [0, 2, 5], [3, 4, 2]], 0]],
    ),
    dict(
        name="island_count", prompt="Write `island_count(grid)`: grid is a list of equal-length strings of '1' (land) and '0' (water); return the number of 4-connected islands.",
        solution="def island_count(grid):\n    if not grid:\n        return 0\n    h, w = len(grid), len(grid[0])\n    seen = set()\n    count = 0\n    for r in range(h):\n        for c in range(w):\n            if grid[r][c] == '1' and (r, c) not in seen:\n                count += 1\n                stack = [(r, c)]\n                seen.add((r, c))\n                while stack:\n                    y, x = stack.pop()\n                    for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):\n                        if 0 <= ny < h and 0 <= nx < w and grid[ny][nx] == '1' and (ny, nx) not in seen:\n                            seen.add((ny, nx)); stack.append((ny, nx))\n    return count\n",
        wrong="def island_count(grid):\n    count = 0\n    for r, row in enumerate(grid):\n        for c, ch in enumerate(row):\n            if ch == '1' and (c == 0 or row[c - 1] == '0') and (r == 0 or grid[r - 1][c] == '0'):\n                count += 1\n    return count\n",
        inputs=[[["11000", "11000", "00100", "00011"]], [[]], [["0"]], [["101", "010", "101"]], [["111", "101", "111"]], [["0110", "1100", "0001"]]],
    ),
    dict(
        name="longest_palindrome", prompt="Write `longest_palindrome(s)` returning the longest palindromic substring of s (the leftmost one on ties; '' for '').",
        solution="def longest_palindrome(s):\n    best = ''\n    for center in range(2 * len(s) - 1):\n        lo, hi = center // 2, center // 2 + center % 2\n        while lo >= 0 and hi < len(s) and s[lo] == s[hi]:\n            lo -= 1; hi += 1\n        cand = s[lo + 1:hi]\n        if len(cand) > len(best) or (len(cand) == len(best) and s.find(cand) < s.find(best)):\n            best = cand\n    return best\n",
        wrong="def longest_palindrome(s):\n    best = ''\n    for center in range(len(s)):\n        lo = hi = center\n        while lo >= 0 and hi < len(s) and s[lo] == s[hi]:\n            lo -= 1; hi += 1\n        if hi - lo - 1 > len(best):\n            best = s[lo + 1:hi]\n    return best\n",
        inputs=[["babad"], ["cbbd"], [""], ["a"], ["forgeeksskeegfor"], ["abcd"]],
    ),
    dict(
        name="knapsack_best", prompt="Write `knapsack_best(weights, values, capacity)` returning the largest total value of a subset of items (each used at most once) whose total weight is at most capacity.",
        solution="def knapsack_best(weights, values, capacity):\n    best = [0] * (capacity + 1)\n    for w, v in zip(weights, values):\n        for c in range(capacity, w - 1, -1):\n            best[c] = max(best[c], best[c - w] + v)\n    return best[capacity]\n",
        wrong="def knapsack_best(weights, values, capacity):\n    best = [0] * (capacity + 1)\n    for w, v in zip(weights, values):\n        for c in range(w, capacity + 1):\n            best[c] = max(best[c], best[c - w] + v)\n    return best[capacity]\n",
        inputs=[[[1, 3, 4, 5], [1, 4, 5, 7], 7], [[2], [3], 6], [[], [], 10], [[5], [10], 4], [[2, 2, 2], [3, 3, 3], 5], [[4, 3, 2], [10, 4, 4], 5]],
    ),
    dict(
        name="merge_k_sorted", prompt="Write `merge_k_sorted(lists)` merging a list of ascending lists into one ascending list.",
        solution="def merge_k_sorted(lists):\n    import heapq\n    return list(heapq.merge(*lists))\n",
        wrong="def merge_k_sorted(lists):\n    out = []\n    for l in lists:\n        out += l\n    return out\n",
        inputs=[[[[1, 4, 5], [1, 3, 4], [2, 6]]], [[]], [[[], [1]]], [[[5, 6], [1, 2]]], [[[-1], [-2], [-3]]]],
    ),
    dict(
        name="max_meetings", prompt="Write `max_meetings(intervals)` returning the largest number of pairwise non-overlapping half-open intervals [start, end) that can be chosen.",
        solution="def max_meetings(intervals):\n    count, end = 0, float('-inf')\n    for s, e in sorted(intervals, key=lambda x: x[1]):\n        if s >= end:\n            count += 1\n            end = e\n    return count\n",
        wrong="def max_meetings(intervals):\n    count, end = 0, float('-inf')\n    for s, e in sorted(intervals):\n        if s >= end:\n            count += 1\n            end = e\n    return count\n",
        inputs=[[[[1, 2], [2, 3], [3, 4], [1, 3]]], [[]], [[[1, 10], [2, 3], [4, 5]]], [[[1, 2], [1, 2], [1, 2]]], [[[0, 5], [5, 9], [1, 4], [4, 6]]]],
    ),
    dict(
        name="sudoku_ok", prompt="Write `sudoku_ok(board)`: board is 9 strings of 9 characters, digits '1'-'9' or '.'. Return True if no digit repeats in any row, column or 3x3 box (empty cells allowed).",
        solution="def sudoku_ok(board):\n    seen = set()\n    for r in range(9):\n        for c in range(9):\n            d = board[r][c]\n            if d == '.':\n                continue\n            keys = (('r', r, d), ('c', c, d), ('b', r // 3, c // 3, d))\n            if any(k in seen for k in keys):\n                return False\n            seen.update(keys)\n    return True\n",
        wrong="def sudoku_ok(board):\n    for r in range(9):\n        row = [d for d in board[r] if d != '.']\n        col = [board[x][r] for x in range(9) if board[x][r] != '.']\n        if len(row) != len(set(row)) or len(col) != len(set(col)):\n            return False\n    return True\n",
        inputs=[
            [["53..7....", "6..195...", ".98....6.", "8...6...3", "4..8.3..1", "7...2...6", ".6....28.", "...419..5", "....8..79"]],
            [["53..7....", "6..195...", ".98....6.", "8...6...3", "4..8.3..1", "7...2...6", ".6....28.", "...419..5", "5...8..79"]],
            [["1........", ".1.......", ".........", ".........", ".........", ".........", ".........", ".........", "........."]],
            [["........."] * 9],
        ],
    ),
    dict(
        name="window_max", prompt="Write `window_max(nums, k)` returning the maximum of every contiguous window of length k (1 <= k <= len(nums)), left to right.",
        solution="def window_max(nums, k):\n    from collections import deque\n    dq, out = deque(), []\n    for i, x in enumerate(nums):\n        while dq and nums[dq[-1]] <= x:\n            dq.pop()\n        dq.append(i)\n        if dq[0] <= i - k:\n            dq.popleft()\n        if i >= k - 1:\n            out.append(nums[dq[0]])\n    return out\n",
        wrong="def window_max(nums, k):\n    return [max(nums[i:i + k]) for i in range(len(nums) - k)]\n",
        inputs=[[[1, 3, -1, -3, 5, 3, 6, 7], 3], [[4], 1], [[1, 2, 3], 3], [[9, 8, 7, 6], 2], [[2, 2, 2, 2], 2]],
    ),
    dict(
        name="expand_repeats", prompt="Write `expand_repeats(s)` expanding nested repeat groups: a number followed by [...] repeats the bracketed text, e.g. '3[a2[c]]' -> 'accaccacc', '2[ab]x' -> 'ababx'.",
        solution="def expand_repeats(s):\n    stack, cur, num = [], '', 0\n    for ch in s:\n        if ch.isdigit():\n            num = num * 10 + int(ch)\n        elif ch == '[':\n            stack.append((cur, num)); cur, num = '', 0\n        elif ch == ']':\n            prev, k = stack.pop(); cur = prev + cur * k\n        else:\n            cur += ch\n    return cur\n",
        wrong="def expand_repeats(s):\n    import re\n    m = re.fullmatch(r'(\\d+)\\[(.*)\\](.*)', s)\n    if not m:\n        return s\n    return m.group(2) * int(m.group(1)) + m.group(3)\n",
        inputs=[["3[a2[c]]"], ["2[ab]x"], ["abc"], ["10[z]"], ["2[a]3[b]"], [""]],
    ),
    dict(
        name="TimeMap", kind="class", prompt="Write a class `TimeMap` with set(key, value, t) and get(key, t) returning the value set for key at the largest timestamp <= t, or '' if none. Timestamps passed to set for one key strictly increase.",
        solution="class TimeMap:\n    def __init__(self):\n        self.d = {}\n    def set(self, key, value, t):\n        self.d.setdefault(key, []).append((t, value))\n    def get(self, key, t):\n        import bisect\n        items = self.d.get(key, [])\n        i = bisect.bisect_right(items, (t, chr(0x10FFFF)))\n        return items[i - 1][1] if i else ''\n",
        wrong="class TimeMap:\n    def __init__(self):\n        self.d = {}\n    def set(self, key, value, t):\n        self.d[key] = (t, value)\n    def get(self, key, t):\n        if key in self.d and self.d[key][0] <= t:\n            return self.d[key][1]\n        return ''\n",
        inputs=[
            [["__init__", []], ["set", ["a", "x", 1]], ["set", ["a", "y", 4]], ["get", ["a", 3]], ["get", ["a", 4]], ["get", ["a", 0]], ["get", ["b", 9]]],
            [["__init__", []], ["set", ["k", "v1", 10]], ["get", ["k", 10]], ["get", ["k", 100]]],
        ],
    ),
    dict(
        name="count_inversions", prompt="Write `count_inversions(nums)` returning the number of index pairs i < j with nums[i] > nums[j]; it must handle 20,000 numbers quickly.",
        solution="def count_inversions(nums):\n    def sort(a):\n        if len(a) <= 1:\n            return a, 0\n        m = len(a) // 2\n        l, x = sort(a[:m]); r, y = sort(a[m:])\n        out, i, j, inv = [], 0, 0, x + y\n        while i < len(l) and j < len(r):\n            if l[i] <= r[j]:\n                out.append(l[i]); i += 1\n            else:\n                out.append(r[j]); j += 1; inv += len(l) - i\n        return out + l[i:] + r[j:], inv\n    return sort(list(nums))[1]\n",
        wrong="def count_inversions(nums):\n    return sum(1 for i in range(len(nums) - 1) if nums[i] > nums[i + 1])\n",
        inputs=[[[2, 4, 1, 3, 5]], [[]], [[5, 4, 3, 2, 1]], [[1, 1, 1]], [list(range(20000, 0, -7))]],
    ),
]
