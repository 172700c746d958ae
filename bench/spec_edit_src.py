"""Inventory records: load them from CSV, check them, and write reports."""

import csv
import json
import os
from dataclasses import dataclass, field


@dataclass
class Item:
    sku: str
    name: str
    quantity: int
    price: float
    tags: list = field(default_factory=list)

    def total_value(self):
        return self.quantity * self.price

    def is_low(self, threshold):
        return self.quantity < threshold


class InventoryError(Exception):
    """Raised when a record cannot be parsed."""


def parse_row(row, line_no):
    if len(row) < 4:
        raise InventoryError(f"line {line_no}: expected 4 fields, got {len(row)}")
    sku, name, quantity, price = row[:4]
    try:
        quantity = int(quantity)
        price = float(price)
    except ValueError as exc:
        raise InventoryError(f"line {line_no}: {exc}") from exc
    tags = [t.strip() for t in row[4].split(";")] if len(row) > 4 else []
    return Item(sku.strip(), name.strip(), quantity, price, tags)


def load_items(path):
    items = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        next(reader, None)
        for line_no, row in enumerate(reader, start=2):
            if not row or row[0].startswith("#"):
                continue
            items.append(parse_row(row, line_no))
    return items


def find_duplicates(items):
    seen = {}
    duplicates = []
    for item in items:
        if item.sku in seen:
            duplicates.append((seen[item.sku], item))
        else:
            seen[item.sku] = item
    return duplicates


def low_stock(items, threshold=5):
    return [item for item in items if item.is_low(threshold)]


def group_by_tag(items):
    groups = {}
    for item in items:
        for tag in item.tags or ["untagged"]:
            groups.setdefault(tag, []).append(item)
    return groups


def inventory_value(items):
    return sum(item.total_value() for item in items)


def price_summary(items):
    if not items:
        return {"min": 0.0, "max": 0.0, "mean": 0.0}
    prices = [item.price for item in items]
    return {
        "min": min(prices),
        "max": max(prices),
        "mean": sum(prices) / len(prices),
    }


def format_item(item):
    tags = ", ".join(item.tags) if item.tags else "-"
    return f"{item.sku:<10} {item.name:<24} {item.quantity:>6} {item.price:>9.2f}  {tags}"


def write_report(items, path, threshold=5):
    lines = ["SKU        NAME                        QTY     PRICE  TAGS"]
    for item in sorted(items, key=lambda i: i.sku):
        lines.append(format_item(item))
    lines.append("")
    lines.append(f"total value: {inventory_value(items):.2f}")
    low = low_stock(items, threshold)
    if low:
        lines.append(f"low stock ({len(low)} items below {threshold}):")
        for item in low:
            lines.append("  " + format_item(item))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_json(items, path):
    data = [
        {
            "sku": item.sku,
            "name": item.name,
            "quantity": item.quantity,
            "price": item.price,
            "tags": item.tags,
        }
        for item in items
    ]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def restock(items, amounts):
    by_sku = {item.sku: item for item in items}
    missing = []
    for sku, amount in amounts.items():
        if sku not in by_sku:
            missing.append(sku)
            continue
        by_sku[sku].quantity += amount
    return missing


def main(argv):
    if len(argv) < 3:
        print("usage: inventory.py ITEMS.csv REPORT.txt [THRESHOLD]")
        return 2
    threshold = int(argv[3]) if len(argv) > 3 else 5
    try:
        items = load_items(argv[1])
    except (OSError, InventoryError) as exc:
        print(f"error: {exc}")
        return 1
    for first, second in find_duplicates(items):
        print(f"warning: duplicate sku {first.sku} ({first.name} / {second.name})")
    write_report(items, argv[2], threshold)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv))
