from mmaemit.layouts.banks import bank_conflicts


def test_linear_words_conflict_free():
    assert bank_conflicts([4 * i for i in range(32)], 4) == 0


def test_broadcast_is_free_and_stride_conflicts():
    assert bank_conflicts([0] * 32, 4) == 0
    assert bank_conflicts([128 * i for i in range(32)], 4) == 31   # every lane in bank 0, distinct words
    assert bank_conflicts([8 * i for i in range(32)], 4) == 1      # stride 2 words: 2-way


def test_16_byte_phases():
    rows_128 = [128 * (i % 8) for i in range(32)]                  # 8 rows of a 128-B row pitch, same column
    assert bank_conflicts(rows_128, 16) == 4 * 7
    swizzled = [128 * (i % 8) + 16 * (i % 8) for i in range(32)]
    assert bank_conflicts(swizzled, 16) == 0
    assert bank_conflicts([None] * 32, 16) == 0
