// DequantizeCpu against DequantizeReference, bit for bit.
#include "gtest/gtest.h"
