def compute_totals(orders, tax_rate=0.2):
    """Sum each customer's orders, with tax, skipping cancelled ones."""
    totals = {}
    for order in orders:
        if order.get("status") == "cancelled":
            continue
        customer = order["customer"]
        amount = order["quantity"] * order["unit_price"]
        totals[customer] = totals.get(customer, 0.0) + amount * (1 + tax_rate)
    return {customer: round(total, 2) for customer, total in totals.items()}
