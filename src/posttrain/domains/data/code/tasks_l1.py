"""Level 1 `code` tasks, written for posttrain: one small function each.

Each entry: name (the function), prompt, solution (passes), wrong (a
plausible bug that fails at least one hidden test), inputs (argument lists of
the hidden tests; expected values are computed from the solution by
build.py into tasks.json).
"""

TASKS = [
    dict(
        name="clamp",
        prompt="Write `clamp(x, lo, hi)` returning x limited to the closed range [lo, hi] (lo <= hi).",
        solution="def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
        wrong="def clamp(x, lo, hi):\n    return min(lo, max(x, hi))\n",
        inputs=[[5, 0, 10], [-3, 0, 10], [12, 0, 10], [0, 0, 0], [7, 7, 9], [2.5, 1.0, 2.0]],
    ),
    dict(
        name="count_vowels",
        prompt="Write `count_vowels(s)` returning how many characters of s are vowels (a, e, i, o, u in either case).",
        solution="def count_vowels(s):\n    return sum(1 for c in s if c.lower() in 'aeiou')\n",
        wrong="def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiou')\n",
        inputs=[["hello"], [""], ["AEIOU"], ["rhythm"], ["Programming In Python"], ["queue"]],
    ),
    dict(
        name="second_largest",
        prompt="Write `second_largest(nums)` returning the second largest distinct value in the list nums, or None if there are fewer than two distinct values.",
        solution="def second_largest(nums):\n    d = sorted(set(nums))\n    return d[-2] if len(d) >= 2 else None\n",
        wrong="def second_largest(nums):\n    d = sorted(nums)\n    return d[-2] if len(d) >= 2 else None\n",
        inputs=[[[3, 1, 4, 1, 5]], [[5, 5, 5]], [[]], [[2, 9]], [[9, 9, 7]], [[-1, -5, -3]]],
    ),
    dict(
        name="is_clean_palindrome",
        prompt="Write `is_clean_palindrome(s)` returning True if s reads the same forwards and backwards after lowercasing and dropping every character that is not a letter or digit.",
        solution="def is_clean_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
        wrong="def is_clean_palindrome(s):\n    t = s.lower().replace(' ', '')\n    return t == t[::-1]\n",
        inputs=[
            ["Never odd or even"],
            ["A man, a plan, a canal: Panama"],
            ["abc"],
            [""],
            ["No 'x' in Nixon"],
            ["12321"],
            ["ab"],
        ],
    ),
    dict(
        name="fizzbuzz_list",
        prompt="Write `fizzbuzz_list(n)` returning a list of strings for 1..n: 'Fizz' for multiples of 3, 'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, else the number as a string.",
        solution="def fizzbuzz_list(n):\n    out = []\n    for i in range(1, n + 1):\n        s = ('Fizz' if i % 3 == 0 else '') + ('Buzz' if i % 5 == 0 else '')\n        out.append(s or str(i))\n    return out\n",
        wrong="def fizzbuzz_list(n):\n    out = []\n    for i in range(1, n + 1):\n        if i % 3 == 0:\n            out.append('Fizz')\n        elif i % 5 == 0:\n            out.append('Buzz')\n        else:\n            out.append(str(i))\n    return out\n",
        inputs=[[1], [5], [15], [0], [16]],
    ),
    dict(
        name="digit_sum",
        prompt="Write `digit_sum(n)` returning the sum of the decimal digits of the integer n (the sign is ignored).",
        solution="def digit_sum(n):\n    return sum(int(c) for c in str(abs(n)))\n",
        wrong="def digit_sum(n):\n    return sum(int(c) for c in str(n) if c != '0')\n",
        inputs=[[0], [7], [1234], [-905], [1000000], [99999]],
    ),
    dict(
        name="run_length",
        prompt="Write `run_length(s)` that encodes runs of repeated characters as character followed by run length, e.g. 'aaabcc' -> 'a3b1c2'. The empty string encodes to ''.",
        solution="def run_length(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)\n",
        wrong="def run_length(s):\n    out = []\n    for c in sorted(set(s), key=s.index):\n        out.append(c + str(s.count(c)))\n    return ''.join(out)\n",
        inputs=[["aaabcc"], [""], ["abc"], ["aabbaa"], ["zzzzzzzzzzzz"], ["abba"]],
    ),
    dict(
        name="merge_sorted",
        prompt="Write `merge_sorted(a, b)` merging two ascending lists of numbers into one ascending list (keep duplicates).",
        solution="def merge_sorted(a, b):\n    i = j = 0\n    out = []\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n",
        wrong="def merge_sorted(a, b):\n    return sorted(set(a) | set(b))\n",
        inputs=[[[1, 3, 5], [2, 4, 6]], [[], [1]], [[1, 1, 2], [1, 3]], [[], []], [[-2, 0], [-3, 5, 9]]],
    ),
    dict(
        name="chunked",
        prompt="Write `chunked(items, k)` splitting the list items into consecutive chunks of length k (the last chunk may be shorter). k >= 1.",
        solution="def chunked(items, k):\n    return [items[i:i + k] for i in range(0, len(items), k)]\n",
        wrong="def chunked(items, k):\n    return [items[i:i + k] for i in range(0, len(items) - k + 1, k)]\n",
        inputs=[[[1, 2, 3, 4, 5], 2], [[], 3], [[1, 2, 3], 3], [[1, 2, 3], 5], [["a", "b", "c", "d"], 1]],
    ),
    dict(
        name="rotate_right",
        prompt="Write `rotate_right(items, k)` returning the list rotated right by k places (k >= 0, possibly larger than the length; an empty list stays empty).",
        solution="def rotate_right(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[-k:] + items[:-k] if k else list(items)\n",
        wrong="def rotate_right(items, k):\n    if not items:\n        return []\n    return items[-k:] + items[:-k]\n",
        inputs=[[[1, 2, 3, 4, 5], 2], [[1, 2, 3], 0], [[1, 2, 3], 3], [[1, 2, 3], 7], [[], 4], [["x"], 9]],
    ),
    dict(
        name="count_set_bits",
        prompt="Write `count_set_bits(n)` returning the number of 1 bits in the binary form of the non-negative integer n.",
        solution="def count_set_bits(n):\n    return bin(n).count('1')\n",
        wrong="def count_set_bits(n):\n    c = 0\n    while n > 1:\n        c += n & 1\n        n >>= 1\n    return c\n",
        inputs=[[0], [1], [7], [8], [255], [2**40 + 3]],
    ),
    dict(
        name="dedupe_runs",
        prompt="Write `dedupe_runs(items)` removing consecutive duplicates from the list items, keeping the first of each run: [1,1,2,1] -> [1,2,1].",
        solution="def dedupe_runs(items):\n    out = []\n    for x in items:\n        if not out or out[-1] != x:\n            out.append(x)\n    return out\n",
        wrong="def dedupe_runs(items):\n    out = []\n    for x in items:\n        if x not in out:\n            out.append(x)\n    return out\n",
        inputs=[[[1, 1, 2, 1]], [[]], [["a", "a", "a"]], [[1, 2, 3]], [[3, 3, 1, 1, 3, 3]]],
    ),
    dict(
        name="prefix_sums",
        prompt="Write `prefix_sums(nums)` returning the list of running totals: [1,2,3] -> [1,3,6].",
        solution="def prefix_sums(nums):\n    out, t = [], 0\n    for x in nums:\n        t += x\n        out.append(t)\n    return out\n",
        wrong="def prefix_sums(nums):\n    out, t = [], 0\n    for x in nums:\n        out.append(t)\n        t += x\n    return out\n",
        inputs=[[[1, 2, 3]], [[]], [[5]], [[-1, 1, -1, 1]], [[10, 0, 0, 2]]],
    ),
    dict(
        name="missing_number",
        prompt="Write `missing_number(nums)`: nums holds n distinct integers from 0..n with exactly one missing; return the missing one.",
        solution="def missing_number(nums):\n    n = len(nums)\n    return n * (n + 1) // 2 - sum(nums)\n",
        wrong="def missing_number(nums):\n    s = sorted(nums)\n    for i in range(len(s)):\n        if s[i] != i:\n            return i\n    return 0\n",
        inputs=[[[3, 0, 1]], [[0]], [[1]], [[0, 1, 2, 4]], [[1, 2, 3, 4, 5, 6, 0]]],
    ),
    dict(
        name="acronym",
        prompt="Write `acronym(phrase)` returning the uppercase first letters of the words of phrase; words are separated by spaces or hyphens, e.g. 'portable network-graphics' -> 'PNG'.",
        solution="def acronym(phrase):\n    words = phrase.replace('-', ' ').split()\n    return ''.join(w[0].upper() for w in words)\n",
        wrong="def acronym(phrase):\n    return ''.join(w[0].upper() for w in phrase.split())\n",
        inputs=[
            ["portable network-graphics"],
            ["as soon as possible"],
            ["complementary metal-oxide semiconductor"],
            [""],
            ["x"],
        ],
    ),
    dict(
        name="triangle_kind",
        prompt="Write `triangle_kind(a, b, c)` returning 'invalid' if the side lengths cannot form a triangle with positive area, else 'equilateral', 'isosceles' or 'scalene'.",
        solution="def triangle_kind(a, b, c):\n    x, y, z = sorted((a, b, c))\n    if x <= 0 or x + y <= z:\n        return 'invalid'\n    if x == z:\n        return 'equilateral'\n    if x == y or y == z:\n        return 'isosceles'\n    return 'scalene'\n",
        wrong="def triangle_kind(a, b, c):\n    if a == b == c:\n        return 'equilateral'\n    if a == b or b == c or a == c:\n        return 'isosceles'\n    return 'scalene'\n",
        inputs=[[2, 2, 2], [3, 4, 5], [2, 2, 3], [1, 2, 3], [0, 0, 0], [5, 1, 1], [3, 5, 3]],
    ),
    dict(
        name="gcd_all",
        prompt="Write `gcd_all(nums)` returning the greatest common divisor of a non-empty list of integers (always non-negative).",
        solution="def gcd_all(nums):\n    from math import gcd\n    g = 0\n    for x in nums:\n        g = gcd(g, x)\n    return g\n",
        wrong="def gcd_all(nums):\n    from math import gcd\n    g = nums[0]\n    for x in nums[1:]:\n        g = gcd(g, x)\n    return g if len(nums) > 1 else 1\n",
        inputs=[[[12, 18, 24]], [[7]], [[0, 5]], [[-4, 6]], [[17, 34, 51, 85]], [[9, 28]]],
    ),
    dict(
        name="pair_count",
        prompt="Write `pair_count(nums, target)` returning how many index pairs i < j have nums[i] + nums[j] == target.",
        solution="def pair_count(nums, target):\n    seen, count = {}, 0\n    for x in nums:\n        count += seen.get(target - x, 0)\n        seen[x] = seen.get(x, 0) + 1\n    return count\n",
        wrong="def pair_count(nums, target):\n    s = set(nums)\n    return sum(1 for x in s if target - x in s and x < target - x)\n",
        inputs=[[[1, 2, 3, 4], 5], [[1, 1, 1], 2], [[], 0], [[2, 2, 2, 2], 4], [[0, -1, 1, 0], 0]],
    ),
    dict(
        name="longest_word",
        prompt="Write `longest_word(sentence)` returning the longest whitespace-separated word of sentence (the first one on ties), or '' for a sentence without words.",
        solution="def longest_word(sentence):\n    best = ''\n    for w in sentence.split():\n        if len(w) > len(best):\n            best = w\n    return best\n",
        wrong="def longest_word(sentence):\n    best = ''\n    for w in sentence.split():\n        if len(w) >= len(best):\n            best = w\n    return best\n",
        inputs=[["the quick brown fox"], [""], ["aa bb cc"], ["one three five seven"], ["  spaced   out  "]],
    ),
    dict(
        name="capitalize_words",
        prompt="Write `capitalize_words(s)` returning s with the first letter of every space-separated word uppercased and the rest unchanged; runs of spaces are preserved exactly.",
        solution="def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n",
        wrong="def capitalize_words(s):\n    return ' '.join(w.capitalize() for w in s.split())\n",
        inputs=[["hello world"], ["  two  spaces"], ["iPhone and macOS"], [""], ["a"]],
    ),
]
